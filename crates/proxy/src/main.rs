//! The `hscale` command: serve, check a configuration, or run the playground.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use hscale::config::Config;
use hscale::{logging, playground, Shared};

#[derive(Parser)]
#[command(
    name = "hscale",
    version,
    about = "A MySQL-protocol partitioning and sharding proxy"
)]
struct Cli {
    /// Configuration file (same as `hscale serve --config FILE`).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Validate the configuration and exit.
    #[arg(long, global = true)]
    check_config: bool,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the proxy.
    Serve,
    /// Local MariaDB servers, a proxy in front of them and demo data.
    Playground {
        #[arg(long, default_value_t = 2)]
        backends: usize,
        #[arg(long, default_value_t = 4040)]
        port: u16,
        /// Reach the servers over TCP, as backends on other hosts are
        /// reached, rather than over their unix sockets.
        #[arg(long)]
        tcp: bool,
        /// A folder with ca.pem, server.pem and server-key.pem: clients may
        /// switch to TLS, and the servers are reached over TLS, verified.
        #[arg(long, value_name = "DIR")]
        tls: Option<std::path::PathBuf>,
    },
}

/// A session's buffers may be freed on another thread than the one that
/// made them (a borrowed connection, a task of the acceptor's); glibc's
/// allocator takes its slow path for that, mimalloc does not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Cmd::Playground {
            backends,
            port,
            tcp,
            tls,
        }) => {
            let path = match tcp {
                true => playground::BackendPath::Tcp,
                false => playground::BackendPath::Unix,
            };
            let _guard = logging::init(&Default::default());
            run_async(async move {
                playground::run(backends.max(1), port, path, tls)
                    .await
                    .map_err(|e| e.to_string())
            })
        }
        Some(Cmd::Serve) | None => {
            let Some(path) = cli.config else {
                eprintln!(
                    "hscale: --config FILE is required (or run `hscale playground`); see --help"
                );
                return ExitCode::from(2);
            };
            let config = match Config::load(&path) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("hscale: {e}");
                    return ExitCode::from(2);
                }
            };
            if cli.check_config {
                println!("{}: ok", path.display());
                return ExitCode::SUCCESS;
            }
            let _guard = logging::init(&config.log);
            run_async(serve(config))
        }
    }
}

/// Runs `work` on the main thread's runtime: the acceptor and the
/// dictionary's loops; the clients have workers of their own (`cores`).
fn run_async(work: impl std::future::Future<Output = Result<(), String>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("hscale: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hscale: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(config: Config) -> Result<(), String> {
    let listener = hscale::server::bind(&config.proxy.listen, config.proxy.max_connections)
        .map_err(|e| format!("cannot listen on {}: {e}", config.proxy.listen))?;
    let mut shared = Shared::new(&config);
    shared.learn_main_backend().await;
    let shared = Arc::new(shared);
    if let Some(http) = &config.proxy.http {
        let http_listener = tokio::net::TcpListener::bind(http)
            .await
            .map_err(|e| format!("cannot listen on {http} (proxy.http): {e}"))?;
        tokio::spawn(hscale::http::serve(http_listener, shared.clone()));
    }
    tracing::info!(listen = %config.proxy.listen, backends = config.backends.len(), "hscale is serving");
    hscale::run(listener, shared, playground::shutdown_signal())
        .await
        .map_err(|e| format!("cannot start the workers: {e}"))
}

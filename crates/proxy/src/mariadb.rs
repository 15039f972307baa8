//! Local MariaDB servers for the playground and the tests: each in its own data
//! directory, on a free port of 127.0.0.1, stopped when dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("MariaDB is not installed ({program} not found). Install it with: apt-get install -y mariadb-server mariadb-client")]
    NotInstalled { program: &'static str },
    #[error("{program} failed ({status}); the end of {log}:\n{tail}")]
    Failed {
        program: &'static str,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("MariaDB on port {port} did not start within {seconds} s; the end of {log}:\n{tail}")]
    NotReady {
        port: u16,
        seconds: u64,
        log: PathBuf,
        tail: String,
    },
    #[error("only {free_mib} MiB free in {dir}; MariaDB needs {needed_mib} MiB there. A server that runs out of disk does not fail: it waits, silently, until space is freed")]
    DiskFull {
        dir: PathBuf,
        free_mib: u64,
        needed_mib: u64,
    },
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

pub struct LocalServer {
    pub port: u16,
    pub dir: PathBuf,
    child: Child,
    binlog: Binlog,
}

/// Whether a server writes the binary log online moves follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binlog {
    /// Full row images (docs/moves.md), as the tests and the playground run.
    Rows,
    /// None, as MariaDB comes out of the package.
    Off,
}

fn find(program: &'static str) -> Result<PathBuf, LaunchError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([
            "/usr/sbin".into(),
            "/usr/local/sbin".into(),
            "/usr/bin".into(),
        ])
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or(LaunchError::NotInstalled { program })
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Server options that keep a data directory small (about 40 MiB instead of
/// 130 MiB with the default 96 MiB redo log): the tests start a few servers per
/// test binary. Given to `mariadb-install-db` too, so that the server starts on
/// the log it was installed with.
const SMALL_DATADIR: [&str; 2] = [
    "--innodb-log-file-size=16M",
    "--innodb-buffer-pool-size=64M",
];

/// Disk one server needs: its data directory and room to grow.
const MIB_PER_SERVER: u64 = 128;

/// Refuses to start `servers` servers under `dir` when the disk is nearly full.
/// MariaDB that runs out of space does not fail: it waits for space, forever,
/// and so would every client.
pub fn ensure_free_space(dir: &Path, servers: usize) -> Result<(), LaunchError> {
    let needed_mib = MIB_PER_SERVER * servers as u64;
    let free_mib = free_bytes(dir)? / (1024 * 1024);
    if free_mib < needed_mib {
        return Err(LaunchError::DiskFull {
            dir: dir.to_owned(),
            free_mib,
            needed_mib,
        });
    }
    Ok(())
}

fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string and `stat` a writable statvfs;
    // statvfs initialises it when it returns 0.
    if unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let stat = unsafe { stat.assume_init() };
    Ok(stat.f_bavail * stat.f_frsize)
}

/// A port that was free a moment ago.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Creates a data directory with `mariadb-install-db`; root may log in over TCP
/// with an empty password.
pub fn install_datadir(datadir: &Path) -> Result<(), LaunchError> {
    let install = find("mariadb-install-db")?;
    let log = datadir.with_extension("install.log");
    let tmpdir = datadir.with_extension("tmp");
    std::fs::create_dir_all(&tmpdir)?;
    let mut cmd = Command::new(install);
    // Servers bootstrapping side by side in the shared /tmp were seen to lose
    // each other's internal temporary tables; each gets a tmpdir of its own.
    cmd.arg("--no-defaults")
        .arg(format!("--datadir={}", datadir.display()))
        .arg(format!("--tmpdir={}", tmpdir.display()))
        .arg("--auth-root-authentication-method=normal")
        .arg("--skip-test-db")
        .args(SMALL_DATADIR);
    if running_as_root() {
        cmd.arg("--user=root");
    }
    let status = cmd
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(log.with_extension("err"))?)
        .status()?;
    if !status.success() {
        let log = log.with_extension("err");
        return Err(LaunchError::Failed {
            program: "mariadb-install-db",
            status: status.to_string(),
            tail: log_tail(&log),
            log,
        });
    }
    Ok(())
}

/// The last lines of a server log, for errors: the playground and the test
/// harness remove their temporary directories, and the log with them.
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

impl LocalServer {
    /// Starts a server in `dir`, copying `template` (a fresh data directory) so
    /// that several servers need only one `mariadb-install-db`.
    pub fn start(dir: &Path, template: &Path) -> Result<LocalServer, LaunchError> {
        Self::start_with(dir, template, Binlog::Rows)
    }

    pub fn start_with(
        dir: &Path,
        template: &Path,
        binlog: Binlog,
    ) -> Result<LocalServer, LaunchError> {
        copy_dir(template, &dir.join("data"))?;
        let port = free_port()?;
        let child = spawn(dir, port, binlog)?;
        let mut server = LocalServer {
            port,
            dir: dir.to_owned(),
            child,
            binlog,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> Result<(), LaunchError> {
        let limit = Duration::from_secs(60);
        let log = self.error_log();
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(status) = self.child.try_wait()? {
                return Err(LaunchError::Failed {
                    program: "mariadbd",
                    status: status.to_string(),
                    tail: log_tail(&log),
                    log,
                });
            }
            // The server greets as soon as it accepts connections.
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                use std::io::Read;
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut first = [0u8; 5];
                if s.read_exact(&mut first).is_ok() && first[4] == 10 {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(LaunchError::NotReady {
            port: self.port,
            seconds: limit.as_secs(),
            tail: log_tail(&log),
            log,
        })
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The server's unix socket: cheaper than TCP for a proxy on the same host.
    pub fn socket(&self) -> String {
        self.dir.join("mariadb.sock").display().to_string()
    }

    pub fn error_log(&self) -> PathBuf {
        self.dir.join("error.log")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server now, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the same server again on the same port and data.
    pub fn restart(&mut self) -> Result<(), LaunchError> {
        self.kill();
        self.child = spawn(&self.dir, self.port, self.binlog)?;
        self.wait_ready()
    }
}

/// Runs mariadbd on the data directory `dir/data`; with TLS where the folder
/// above holds `tls/ca.pem`, `tls/server.pem` and `tls/server-key.pem` (the
/// test servers' certificates, shared by the servers of one folder).
fn spawn(dir: &Path, port: u16, binlog: Binlog) -> Result<Child, LaunchError> {
    let tmpdir = dir.join("tmp");
    std::fs::create_dir_all(&tmpdir)?;
    let mut cmd = Command::new(find("mariadbd")?);
    cmd.arg("--no-defaults")
        .arg(format!("--datadir={}", dir.join("data").display()))
        .arg(format!("--tmpdir={}", tmpdir.display()))
        .arg(format!("--port={port}"))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--socket={}", dir.join("mariadb.sock").display()))
        .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
        .arg(format!("--log-error={}", dir.join("error.log").display()))
        .args([
            "--max-connections=1000",
            "--max-allowed-packet=1G",
            "--innodb-flush-log-at-trx-commit=2",
            "--local-infile=1",
        ])
        .arg(format!("--server-id={port}"))
        .args(SMALL_DATADIR);
    if binlog == Binlog::Rows {
        // What online moves read (docs/moves.md): a binary log of full row
        // images; each server its own id, as replicas of one source need.
        cmd.arg(format!("--log-bin={}", dir.join("binlog").display()))
            .args([
                "--binlog-format=ROW",
                "--binlog-row-image=FULL",
                "--max-binlog-size=64M",
                "--binlog-expire-logs-seconds=3600",
                // A replica logs what it applies: promoted, it serves the
                // others the same history (docs/replicas.md).
                "--log-slave-updates",
                // As MariaDB's own test runner: stored functions that write
                // need no DETERMINISTIC with a binary log on.
                "--log-bin-trust-function-creators=1",
            ]);
    }
    if let Some(tls) = dir.parent().map(|up| up.join("tls")) {
        let (ca, cert, key) = (
            tls.join("ca.pem"),
            tls.join("server.pem"),
            tls.join("server-key.pem"),
        );
        if ca.exists() && cert.exists() && key.exists() {
            cmd.arg(format!("--ssl-ca={}", ca.display()))
                .arg(format!("--ssl-cert={}", cert.display()))
                .arg(format!("--ssl-key={}", key.display()));
        }
    }
    if running_as_root() {
        cmd.arg("--user=root");
    }
    Ok(cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?)
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_says_what_to_install() {
        let err = find("mariadbd-that-does-not-exist")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("apt-get install -y mariadb-server mariadb-client"),
            "{err}"
        );
    }

    #[test]
    fn servers_are_not_started_on_a_disk_without_room_for_them() {
        let dir = std::env::temp_dir();
        ensure_free_space(&dir, 0).expect("no server needs no space");
        let err = ensure_free_space(&dir, 1 << 40).unwrap_err();
        assert!(matches!(err, LaunchError::DiskFull { .. }), "{err}");
        assert!(err.to_string().contains("waits"), "{err}");
    }
}

//! The `hscale` binary: --version, --check-config, serve with a log file, and
//! the playground from start to Ctrl-C.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hscale_testkit::{cluster, run_program, scratch};

const HSCALE: &str = env!("CARGO_BIN_EXE_hscale");

fn config_text(listen_port: u16, extra_log: &str) -> String {
    format!(
        r#"
[proxy]
listen = "127.0.0.1:{listen_port}"

[[users]]
name = "app"
password = "secret"
backend_user = "root"
backend_password = ""

[[backends]]
id = 1
address = "127.0.0.1:{backend}"
user = "root"

[log]
level = "warn"
{extra_log}
[log.categories]
"hscale::session" = "info"
"#,
        backend = cluster().port(1)
    )
}

fn interrupt(pid: u32) {
    run_program("kill", &["-INT", &pid.to_string()]);
}

#[test]
fn version_and_config_check() {
    let version = run_program(HSCALE, &["--version"]);
    assert!(version.starts_with("hscale "), "{version}");
    let dir = scratch("check_config");
    let good = dir.join("good.toml");
    std::fs::write(&good, config_text(4999, "")).unwrap();
    let ok = run_program(
        HSCALE,
        &[
            "serve",
            "--config",
            good.to_str().unwrap(),
            "--check-config",
        ],
    );
    assert!(ok.contains("ok"), "{ok}");
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        config_text(4999, "")
            .replace("127.0.0.1:4999", "nowhere")
            .replace("id = 1", "id = 0"),
    )
    .unwrap();
    let out = Command::new(HSCALE)
        .args(["--config", bad.to_str().unwrap(), "--check-config"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("proxy.listen:") && err.contains("backends[0].id:"),
        "{err}"
    );
    let unknown = dir.join("unknown.toml");
    std::fs::write(&unknown, config_text(4999, "colour = true")).unwrap();
    let out = Command::new(HSCALE)
        .args(["--config", unknown.to_str().unwrap(), "--check-config"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("colour"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(socket, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn serve_logs_categories_to_its_file_and_answers_http() {
    let dir = scratch("serve_log");
    let port = hscale::mariadb::free_port().unwrap();
    let http = hscale::mariadb::free_port().unwrap();
    let log = dir.join("hscale.log");
    let config = dir.join("hscale.toml");
    let file_line = format!("file = \"{}\"\nrotation = \"never\"", log.display());
    let text = config_text(port, &file_line).replace(
        &format!("listen = \"127.0.0.1:{port}\""),
        &format!("listen = \"127.0.0.1:{port}\"\nhttp = \"127.0.0.1:{http}\""),
    );
    std::fs::write(&config, text).unwrap();
    let mut child = Command::new(HSCALE)
        .args(["serve", "--config", config.to_str().unwrap()])
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut conn = loop {
        match hscale_testkit::try_connect(port, "app", "secret", None) {
            Ok(conn) => break conn,
            Err(e) if started.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("hscale serve did not come up: {e}"),
        }
    };
    use mysql::prelude::Queryable;
    assert_eq!(conn.query_first::<i32, _>("SELECT 11").unwrap(), Some(11));
    let metrics = http_get(http, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200 OK"), "{metrics}");
    let questions: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("hscale_questions_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(questions >= 1, "{metrics}");
    assert!(
        metrics.contains("hscale_backend_connections{backend=\"1\"} "),
        "{metrics}"
    );
    assert!(metrics.contains("hscale_clients 1"), "{metrics}");
    assert!(http_get(http, "/status").contains("Uptime: "));
    // The monitor's first check of the lone host of backend 1.
    let up = format!(
        "hscale_backend_host_up{{backend=\"1\",host=\"127.0.0.1:{}\",role=\"writer\"}} 1",
        cluster().port(1)
    );
    hscale_testkit::wait_for("backend 1 up in /metrics", Duration::from_secs(20), || {
        http_get(http, "/metrics").contains(&up).then_some(())
    });
    assert!(
        http_get(http, "/status").contains("Backend 1 "),
        "a line per backend host"
    );
    assert!(http_get(http, "/nothing").starts_with("HTTP/1.1 404"));
    drop(conn);
    std::thread::sleep(Duration::from_millis(300));
    interrupt(child.id());
    assert!(child.wait().unwrap().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("client connected"),
        "session info reaches the file:\n{text}"
    );
    assert!(
        !text.contains("hscale is serving"),
        "the default level is warn:\n{text}"
    );
    assert!(!text.contains('\x1b'), "no colour codes in a file:\n{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn playground_serves_the_demo_and_cleans_up_on_ctrl_c() {
    let port = hscale::mariadb::free_port().unwrap();
    let mut child = Command::new(HSCALE)
        .args(["playground", "--port", &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut pids = Vec::new();
    let mut ports = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(pid) = line.split("(pid ").nth(1) {
            pids.push(pid.trim_end_matches(')').to_string());
        }
        if let Some(port) = line.split("127.0.0.1:").nth(1) {
            ports.push(port.split(' ').next().unwrap_or_default().to_string());
        }
        if line.contains("is ready") {
            break;
        }
    }
    if pids.len() != 2 {
        let _ = child.kill();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        panic!("two MariaDB servers by default, started {pids:?}:\n{err}");
    }
    let query = |port: &str, sql: &str| {
        run_program(
            "mariadb",
            &[
                "-h127.0.0.1",
                &format!("-P{port}"),
                "-uroot",
                "demo",
                "--batch",
                "-e",
                sql,
            ],
        )
    };
    // The seeds' example: users by PREFIX(3) of nickname, 'mar' on backend 2.
    let proxy = port.to_string();
    let martin = query(
        &proxy,
        "SELECT id, nickname FROM users WHERE nickname = 'Martin'",
    );
    assert_eq!(martin, "id\tnickname\n1\tmartin\n");
    let lookup = query(&proxy, "HSCALE LOOKUP('users', 'Marvin')");
    assert_eq!(
        lookup,
        "partition_value\tpartition\tbackend\ttable\nmar\tnick1\t2\tusers_nick1\n"
    );
    let on_backend_2 = query(&ports[1], "SELECT nickname FROM users_nick1 ORDER BY id");
    assert_eq!(on_backend_2, "nickname\nmartin\nmarvin\nMarlene\n");
    let everyone = query(&proxy, "SELECT nickname FROM users");
    assert_eq!(everyone.lines().count(), 1 + 8, "{everyone}");
    let stderr = child.stderr.take().unwrap();
    interrupt(child.id());
    assert!(child.wait().unwrap().success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut err).unwrap();
    assert!(
        err.contains("INFO") && !err.contains('\x1b'),
        "stderr that is not a terminal gets log lines without colour codes:\n{err}"
    );
    let data_dir = err
        .lines()
        .find_map(|l| l.split(" in ").nth(1))
        .map(|d| d.trim_end_matches(" ...").to_string())
        .expect("the playground names its directory");
    assert!(
        !std::path::Path::new(&data_dir).exists(),
        "{data_dir} is removed"
    );
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "MariaDB {pid} stopped"
        );
    }
}

/// The worker threads of process `pid` (named `hscale-core-N`).
fn workers_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("hscale-core-"))
        .count()
}

/// How a test starts `hscale serve`: as it is, pinned to CPU 0, or in a
/// control group whose CPU quota is one CPU.
enum Launch {
    Plain,
    Pinned,
    Quota(CpuQuota),
}

/// A control group with a quota of one CPU (100 ms per 100 ms), cgroup v2
/// or v1's `cpu` controller; removed when dropped. `None` where this
/// process may not make one (not root, a read-only /sys/fs/cgroup in a
/// container).
struct CpuQuota {
    dir: std::path::PathBuf,
}

impl CpuQuota {
    fn make(name: &str) -> Option<CpuQuota> {
        let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers");
        let (dir, settings): (_, &[(&str, &str)]) = match v2.exists() {
            true => {
                // The root's children get the cpu controller only if it
                // hands it down.
                let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+cpu");
                (
                    std::path::PathBuf::from("/sys/fs/cgroup").join(name),
                    &[("cpu.max", "100000 100000")],
                )
            }
            false => (
                std::path::PathBuf::from("/sys/fs/cgroup/cpu").join(name),
                &[
                    ("cpu.cfs_period_us", "100000"),
                    ("cpu.cfs_quota_us", "100000"),
                ],
            ),
        };
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).ok()?;
        let quota = CpuQuota { dir };
        for (file, value) in settings {
            std::fs::write(quota.dir.join(file), value).ok()?;
        }
        Some(quota)
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `threads = 0` runs one worker per CPU the process may use: under
/// `taskset -c 0`, and in a control group with a quota of one CPU (as a
/// container's), one, whatever the machine has; a number runs that many.
/// Each serves clients.
#[test]
fn threads_zero_runs_a_worker_per_cpu_the_process_may_use() {
    let dir = scratch("workers");
    let mut cases = vec![(0, Launch::Pinned, 1), (3, Launch::Plain, 3)];
    // Only root may make a control group, and not inside every container.
    match CpuQuota::make(&format!("hscale-workers-{}", std::process::id())) {
        Some(quota) => cases.push((0, Launch::Quota(quota), 1)),
        None => eprintln!("no control group may be made here: the CPU quota case is left out"),
    }
    for (threads, launch, expected) in cases {
        let port = hscale::mariadb::free_port().unwrap();
        let config = dir.join(format!("hscale-{threads}.toml"));
        let text = config_text(port, "").replace(
            &format!("listen = \"127.0.0.1:{port}\""),
            &format!("listen = \"127.0.0.1:{port}\"\nthreads = {threads}"),
        );
        std::fs::write(&config, text).unwrap();
        let mut command = match &launch {
            Launch::Pinned => {
                let mut command = Command::new("taskset");
                command.args(["-c", "0", HSCALE]);
                command
            }
            Launch::Plain => Command::new(HSCALE),
            // The shell joins the group, then becomes hscale.
            Launch::Quota(quota) => {
                let mut command = Command::new("sh");
                command.args([
                    "-c",
                    "echo $$ > \"$0/cgroup.procs\" && exec \"$@\"",
                    quota.dir.to_str().unwrap(),
                    HSCALE,
                ]);
                command
            }
        };
        let mut child = command
            .args(["serve", "--config", config.to_str().unwrap()])
            .spawn()
            .unwrap();
        let started = Instant::now();
        let mut clients: Vec<mysql::Conn> = Vec::new();
        while clients.len() < 4 {
            match hscale_testkit::try_connect(port, "app", "secret", None) {
                Ok(conn) => clients.push(conn),
                Err(e) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(20),
                        "hscale serve did not come up: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        use mysql::prelude::Queryable;
        for (i, conn) in clients.iter_mut().enumerate() {
            assert_eq!(
                conn.query_first::<usize, _>(format!("SELECT {i}")).unwrap(),
                Some(i)
            );
        }
        assert_eq!(workers_of(child.id()), expected, "threads = {threads}");
        drop(clients);
        interrupt(child.id());
        assert!(child.wait().unwrap().success());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

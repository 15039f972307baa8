//! A result far larger than memory streams through hscale to a slow client:
//! hscale forwards as it reads and stops reading when the client stops, so its
//! memory stays bounded. Alone in its binary, so that its RSS is the proxy's.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hscale_testkit::Proxy;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

#[test]
fn two_million_rows_stream_to_a_slow_client_in_bounded_memory() {
    let db = hscale_testkit::cluster().database("streaming");
    let proxy = Proxy::for_cluster();
    let baseline = rss_kib();
    let peak = Arc::new(AtomicU64::new(baseline));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut client = Command::new("mariadb")
        .args([
            "-h127.0.0.1",
            &format!("-P{}", proxy.port),
            "-uroot",
            "--quick",
            "--batch",
            "--skip-column-names",
            &db,
            "-e",
            "SELECT seq, REPEAT('x', 200) FROM seq_1_to_2000000",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("mariadb client");
    let reader = BufReader::with_capacity(64 * 1024, client.stdout.take().unwrap());
    let mut rows = 0u64;
    let mut last = 0u64;
    for line in reader.lines() {
        let line = line.unwrap();
        rows += 1;
        last = line.split('\t').next().unwrap().parse().unwrap();
        // A slow consumer for the first part: the proxy must stop reading.
        if rows < 200_000 && rows.is_multiple_of(2_000) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    assert!(client.wait().unwrap().success());
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    assert_eq!((rows, last), (2_000_000, 2_000_000));
    let grown_mib = (peak.load(Ordering::Relaxed) - baseline) / 1024;
    println!("proxy RSS grew by {grown_mib} MiB while streaming ~420 MB");
    assert!(grown_mib < 100, "RSS grew by {grown_mib} MiB");
}

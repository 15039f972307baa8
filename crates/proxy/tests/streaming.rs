//! A result far larger than memory streams through hscale to a slow client:
//! hscale forwards as it reads and stops reading when the client stops, so its
//! memory stays bounded. Alone in its binary, so that its RSS is the proxy's.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use hscale_testkit::{PeakRss, Proxy};

#[test]
fn two_million_rows_stream_to_a_slow_client_in_bounded_memory() {
    let db = hscale_testkit::cluster().database("streaming");
    let proxy = Proxy::for_cluster();
    let peak = PeakRss::start();
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
    assert_eq!((rows, last), (2_000_000, 2_000_000));
    let grown_mib = peak.grown_mib();
    println!("proxy RSS grew by {grown_mib} MiB while streaming ~420 MB");
    assert!(grown_mib < 100, "RSS grew by {grown_mib} MiB");
}

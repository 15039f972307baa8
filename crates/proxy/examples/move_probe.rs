//! Writers for bench/moves.sh: each connection updates random rows of one
//! MOD class (`id % modulus` in `classes`) through hscale, autocommit, until
//! the stop file appears; then prints, for all its writers together, the
//! statements that completed, the longest gap between two completions, the
//! slowest statement and the errors. The gap is the write pause a client of
//! the moved partition sees; a writer of the other classes shows that they
//! did not wait.
//!
//!   move_probe PORT DB TABLE MODULUS CLASSES(1,3) MAX_ID WRITERS STOP_FILE LABEL

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use rand::Rng;

struct Tally {
    completions: Vec<Instant>,
    slowest: Duration,
    errors: Vec<String>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [port, db, table, modulus, classes, max_id, writers, stop, label] = args.as_slice() else {
        eprintln!("usage: move_probe PORT DB TABLE MODULUS CLASSES MAX_ID WRITERS STOP_FILE LABEL");
        std::process::exit(2);
    };
    let modulus: u64 = modulus.parse().expect("MODULUS");
    let classes: Vec<u64> = classes
        .split(',')
        .map(|c| c.parse().expect("CLASSES"))
        .collect();
    let max_id: u64 = max_id.parse().expect("MAX_ID");
    let writers: usize = writers.parse().expect("WRITERS");
    let stop = PathBuf::from(stop);
    // prefer_socket: the driver would otherwise ask for @@socket and go
    // around hscale to the MariaDB on this host.
    let url = format!("mysql://root@127.0.0.1:{port}/{db}?prefer_socket=false");
    let sql = format!("UPDATE {table} SET k = k + 1 WHERE id = ?");

    let tally = Arc::new(Mutex::new(Tally {
        completions: Vec::new(),
        slowest: Duration::ZERO,
        errors: Vec::new(),
    }));
    let threads: Vec<_> = (0..writers)
        .map(|_| {
            let (url, sql, stop, classes, tally) = (
                url.clone(),
                sql.clone(),
                stop.clone(),
                classes.clone(),
                tally.clone(),
            );
            std::thread::spawn(move || {
                let mut conn =
                    mysql::Conn::new(mysql::Opts::from_url(&url).expect("url")).expect("connect");
                let statement = conn.prep(&sql).expect("prepare");
                let mut rng = rand::rng();
                let mut completions = Vec::new();
                let mut slowest = Duration::ZERO;
                let mut errors = Vec::new();
                while !stop.exists() {
                    let class = classes[rng.random_range(0..classes.len())];
                    // An id in 1..=max_id of the class.
                    let id = rng.random_range(1..=max_id / modulus) * modulus
                        - (modulus - class) % modulus;
                    let started = Instant::now();
                    match conn.exec_drop(&statement, (id,)) {
                        Ok(()) => {
                            let now = Instant::now();
                            slowest = slowest.max(now - started);
                            completions.push(now);
                        }
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                let mut tally = tally.lock().unwrap();
                tally.completions.extend(completions);
                tally.slowest = tally.slowest.max(slowest);
                tally.errors.extend(errors);
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("writer");
    }

    let mut tally = tally.lock().unwrap();
    tally.completions.sort();
    let (longest_gap, gap_end) = tally
        .completions
        .windows(2)
        .map(|w| (w[1] - w[0], w[1]))
        .max()
        .unwrap_or((Duration::ZERO, Instant::now()));
    // The gap's end on the wall clock, to set beside the move's phases.
    let ended = std::time::SystemTime::now() - gap_end.elapsed();
    let ended = ended
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    println!(
        "{label}: {} writes, longest gap between writes {:.0} ms (ended at {:02}:{:02}:{:06.3} UTC), slowest write {:.0} ms, {} errors{}",
        tally.completions.len(),
        longest_gap.as_secs_f64() * 1000.0,
        (ended / 3600.0) as u64 % 24,
        (ended / 60.0) as u64 % 60,
        ended % 60.0,
        tally.slowest.as_secs_f64() * 1000.0,
        tally.errors.len(),
        tally
            .errors
            .first()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default(),
    );
}

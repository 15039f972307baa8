//! The order-entry application (`hscale_testkit::order_entry`) as a
//! program, for bench/order_entry.sh:
//!
//!   order-entry create|shard|load|check PORT DB
//!   order-entry run PORT DB CLIENTS SECONDS
//!
//! `run` prints one line: transactions a second, how many committed, rolled
//! back by the application, retried after a deadlock or lock wait, and the
//! slowest transaction. `ORDER_ENTRY_SCALE=standard` loads and runs the
//! size of the application issue 55 was filed with (`Scale::STANDARD`)
//! instead of `Scale::BENCH`.

use std::time::{Duration, Instant};

use hscale_testkit::order_entry::{self, Outcome, Scale, Terminal};

fn scale() -> Scale {
    match std::env::var("ORDER_ENTRY_SCALE").as_deref() {
        Ok("standard") => Scale::STANDARD,
        Ok("bench") | Err(_) => Scale::BENCH,
        Ok(other) => {
            eprintln!("ORDER_ENTRY_SCALE is bench or standard, not {other}");
            std::process::exit(2);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [command, port, db, rest @ ..] = args.as_slice() else {
        eprintln!("usage: order-entry create|shard|load|check|run PORT DB [CLIENTS SECONDS]");
        std::process::exit(2);
    };
    let port: u16 = port.parse().expect("a port");
    let scale = scale();
    let connect = || hscale_testkit::connect(port, "root", "", Some(db));
    match (command.as_str(), rest) {
        ("create", []) => order_entry::create(&mut connect()).expect("the tables"),
        ("shard", []) => order_entry::shard(&mut connect()).expect("partitions"),
        ("load", []) => order_entry::load(&mut connect(), scale).expect("the rows"),
        ("check", []) => {
            let mut conn = connect();
            let mut checked = Vec::new();
            let mut times = Vec::new();
            for n in 0..order_entry::CHECKS.len() {
                let started = Instant::now();
                checked.push(order_entry::check_one(&mut conn, n).expect("a check"));
                times.push(started.elapsed().as_millis());
            }
            let broken = order_entry::violations(&checked);
            let rows: usize = checked.iter().map(Vec::len).sum();
            let each: Vec<String> = times.iter().map(u128::to_string).collect();
            println!(
                "{rows} rows checked in {} ms ({} ms each), {} break a rule",
                times.iter().sum::<u128>(),
                each.join(" + "),
                broken.len()
            );
            for line in broken.iter().take(5) {
                println!("  {line}");
            }
        }
        ("run", [clients, seconds]) => {
            let clients: u64 = clients.parse().expect("a number of clients");
            let seconds: u64 = seconds.parse().expect("seconds");
            run(connect, scale, clients, Duration::from_secs(seconds));
        }
        _ => {
            eprintln!("unknown command or arguments: {args:?}");
            std::process::exit(2);
        }
    }
}

#[derive(Default)]
struct Tally {
    committed: u64,
    rolled_back: u64,
    retried: u64,
    slowest: Duration,
}

fn run(connect: impl Fn() -> mysql::Conn, scale: Scale, clients: u64, length: Duration) {
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|client| {
            let mut conn = connect();
            std::thread::spawn(move || {
                let mut terminal = Terminal::new(client + 1, scale);
                let mut tally = Tally::default();
                while started.elapsed() < length {
                    let t = terminal.next_transaction();
                    let begun = Instant::now();
                    loop {
                        match order_entry::run(&mut conn, &t, &mut String::new()) {
                            Ok(Outcome::Committed) => tally.committed += 1,
                            Ok(Outcome::RolledBack) => tally.rolled_back += 1,
                            Err(e) if order_entry::retried(&e) => {
                                tally.retried += 1;
                                continue;
                            }
                            Err(e) => panic!("{t:?}: {e}"),
                        }
                        break;
                    }
                    tally.slowest = tally.slowest.max(begun.elapsed());
                }
                tally
            })
        })
        .collect();
    let mut all = Tally::default();
    for worker in workers {
        let tally = worker.join().expect("a client");
        all.committed += tally.committed;
        all.rolled_back += tally.rolled_back;
        all.retried += tally.retried;
        all.slowest = all.slowest.max(tally.slowest);
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{:.1} transactions/s: {} committed, {} rolled back by the application, {} retried (deadlock or lock wait), slowest {} ms",
        (all.committed + all.rolled_back) as f64 / elapsed,
        all.committed,
        all.rolled_back,
        all.retried,
        all.slowest.as_millis()
    );
}

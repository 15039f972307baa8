//! The deadlock detector: lock waits that form a cycle through several
//! backends, which no server sees alone (`hscale_transaction::deadlock`).
//! It looks only while some client's command has run through a whole
//! `deadlock_check_ms`: it tells the other instances, through the
//! dictionary, which backend connections its waiting sessions hold, reads
//! theirs and each backend's transactions and lock waits, and ends the
//! transaction a cycle names at two fresh looks in a row, if that
//! transaction is one of its own sessions' (every instance that sees the
//! cycle names the same one) — its waiting connection killed, the rest
//! rolled back by its session, the client answered 1213 as MariaDB answers
//! a deadlock on one server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hscale_planner::KillScope;
use hscale_transaction::deadlock::{victims, ServerTrx, Victim};
use hscale_wire::resultset::TextValue;
use tokio::time::Instant;

use crate::backend::ConnKey;
use crate::dictionary::store::{exec, ident, text, text_literal};
use crate::shared::{Counters, SessionHandle, Shared};

/// A session, by its instance's name and its connection id there: what
/// every instance calls it alike.
type Holder = (Arc<str>, u32);

/// Each transaction with the threads whose locks it waits for: a row per
/// wait, one with NULL for a transaction that waits for none; and each
/// transaction's statement, where the reader finds its own: `{look}` makes
/// it this look's, so that a row of the reader with it says the rows are
/// of this read.
const LOCK_WAITS: &str = "SELECT {look} AS look, t.trx_mysql_thread_id, t.trx_weight, \
     b.trx_mysql_thread_id, t.trx_query \
     FROM information_schema.INNODB_TRX t \
     LEFT JOIN information_schema.INNODB_LOCK_WAITS w ON w.requesting_trx_id = t.trx_id \
     LEFT JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id";

/// InnoDB renews what INNODB_TRX shows only when it was last read more than
/// 100 ms ago, by anyone: two readers a steady 60 ms apart would show each
/// other the rows of before for ever. An instance reads a turn after its
/// last read; the instances with waiting sessions take turns by the wall
/// clock, each reading at the start of its own.
const TURN: Duration = Duration::from_millis(140);

/// How long until this instance's next turn to read, among itself and
/// `others` (the instances with waiting sessions, in any order, repeated).
fn until_turn<'a>(me: &'a str, others: impl Iterator<Item = &'a str>) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    next_turn(now, me, others) - now
}

/// The start of `me`'s first turn after `now` (since the epoch): turns go
/// round the readers in the order of their names.
fn next_turn<'a>(now: Duration, me: &'a str, others: impl Iterator<Item = &'a str>) -> Duration {
    let mut readers: Vec<&str> = others.chain(std::iter::once(me)).collect();
    readers.sort_unstable();
    readers.dedup();
    let count = readers.len() as u128;
    let mine = readers
        .iter()
        .position(|r| *r == me)
        .expect("me among them") as u128;
    let turn = TURN.as_micros();
    let mut next = now.as_micros() / turn + 1;
    next += (mine + count - next % count) % count;
    Duration::from_micros((next * turn) as u64)
}

pub async fn detect_loop(shared: Arc<Shared>) {
    let Some(wait) = shared.deadlock_check else {
        return;
    };
    let mut tick = tokio::time::interval(wait.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let me: Arc<str> = Arc::from(shared.dictionary.instance.as_str());
    let mut running_before: HashMap<u32, u64> = HashMap::new();
    let mut suspected: Vec<Victim<Holder>> = Vec::new();
    let mut told: Vec<(u32, u32, u32)> = Vec::new();
    let mut looks: u64 = 0;
    let mut last_read = Instant::now();
    loop {
        tick.tick().await;
        let sessions = shared.sessions.all();
        let running: HashMap<u32, u64> = sessions
            .iter()
            .filter_map(|(id, s)| Some((*id, s.running_command()?)))
            .collect();
        // A command seen at the last tick too has run at least `wait`.
        let waiting: Vec<u32> = running
            .iter()
            .filter(|(id, command)| running_before.get(id) == Some(command))
            .map(|(id, _)| *id)
            .collect();
        running_before = running;
        let held = held_by(&sessions, &waiting);
        if held != told && tell(&shared, &held).await {
            told = held;
        }
        if waiting.is_empty() {
            suspected.clear();
            continue;
        }
        let others = held_elsewhere(&shared).await;
        match others.is_empty() {
            // Alone: a turn after its own last read.
            true => tokio::time::sleep_until(last_read + TURN).await,
            false => tokio::time::sleep(until_turn(&me, others.values().map(|(i, _)| &**i))).await,
        }
        looks += 1;
        let found = find(&shared, &sessions, &me, &others, looks).await;
        last_read = Instant::now();
        // Another reader read within 100 ms (a turn came late): this look
        // says nothing, the next tells.
        let Some(found) = found else {
            continue;
        };
        // Each backend was read at its own moment: a cycle is one only if
        // the next look shows it again.
        let (confirmed, seen_once): (Vec<_>, Vec<_>) =
            found.into_iter().partition(|v| suspected.contains(v));
        for victim in confirmed.iter().filter(|v| v.session.0 == me) {
            end(&shared, &sessions, victim).await;
        }
        suspected = seen_once;
    }
}

/// The backend connections of the sessions in `waiting`, as (session,
/// backend, thread), in order.
fn held_by(sessions: &[(u32, Arc<SessionHandle>)], waiting: &[u32]) -> Vec<(u32, u32, u32)> {
    let mut held: Vec<(u32, u32, u32)> = sessions
        .iter()
        .filter(|(id, _)| waiting.contains(id))
        .flat_map(|(id, s)| {
            s.holding()
                .into_iter()
                .map(move |(backend, thread)| (*id, backend, thread))
        })
        .collect();
    held.sort_unstable();
    held
}

/// The waiting sessions of this instance's, in the dictionary for the other
/// instances' detectors; whether the dictionary took them.
async fn tell(shared: &Shared, held: &[(u32, u32, u32)]) -> bool {
    let table = waiting_table(shared);
    let me = text_literal(&shared.dictionary.instance);
    let mut statements = vec![format!("DELETE FROM {table} WHERE instance = {me}")];
    if !held.is_empty() {
        let rows: Vec<String> = held
            .iter()
            .map(|(session, backend, thread)| format!("({me}, {session}, {backend}, {thread})"))
            .collect();
        statements.push(format!(
            "INSERT INTO {table} (instance, session, backend, thread) VALUES {}",
            rows.join(", ")
        ));
    }
    on_dictionary(shared, &statements).await.is_some()
}

/// The backend connections the waiting sessions of other live instances
/// hold, by (backend, thread).
async fn held_elsewhere(shared: &Shared) -> HashMap<(u32, u32), Holder> {
    let sql = format!(
        "SELECT w.instance, w.session, w.backend, w.thread FROM {} w \
         JOIN {}.instances i ON i.id = w.instance \
         WHERE w.instance <> {} AND i.seen > NOW(6) - INTERVAL {} MICROSECOND",
        waiting_table(shared),
        ident(&shared.dictionary.schema),
        text_literal(&shared.dictionary.instance),
        shared.dictionary.lease.as_micros()
    );
    let Some(rows) = on_dictionary(shared, &[sql]).await else {
        return HashMap::new();
    };
    (0..rows.len())
        .filter_map(|row| {
            let number = |column| text(&rows, row, column).parse::<u32>().ok();
            let holder: Holder = (Arc::from(text(&rows, row, 0)), number(1)?);
            Some(((number(2)?, number(3)?), holder))
        })
        .collect()
}

fn waiting_table(shared: &Shared) -> String {
    format!("{}.waiting_sessions", ident(&shared.dictionary.schema))
}

/// Runs `statements` in turn on a service connection of the dictionary's
/// backend: the last one's rows, or `None` where one failed.
async fn on_dictionary(shared: &Shared, statements: &[String]) -> Option<crate::backend::Rows> {
    let pool = &shared.pools[shared.main];
    let bucket = pool.bucket(ConnKey::service());
    let mut lease = pool.acquire(&bucket, None).await.ok()?;
    let mut last = None;
    for sql in statements {
        match exec(&mut lease.conn, sql).await {
            Ok(rows) => last = Some(rows),
            Err(e) => {
                tracing::debug!("deadlock detector: the dictionary refused {sql}: {e}");
                return None;
            }
        }
    }
    pool.release_to(&bucket, lease.conn);
    last
}

/// The victims of the cycles through this instance's sessions (`me`) and
/// the waiting sessions of others, where every backend was read afresh.
async fn find(
    shared: &Shared,
    sessions: &[(u32, Arc<SessionHandle>)],
    me: &Arc<str>,
    others: &HashMap<(u32, u32), Holder>,
    look: u64,
) -> Option<Vec<Victim<Holder>>> {
    // A thread two sessions claim (one gave it back to the pool during its
    // command, the other took it) belongs to neither: no edge, no victim.
    let mut owners: HashMap<(u32, u32), Option<Holder>> = HashMap::new();
    let mine = sessions.iter().flat_map(|(id, session)| {
        let holder: Holder = (me.clone(), *id);
        session
            .holding()
            .into_iter()
            .map(move |thread| (thread, holder.clone()))
    });
    for (thread, holder) in mine.chain(others.iter().map(|(t, h)| (*t, h.clone()))) {
        owners
            .entry(thread)
            .and_modify(|owner| *owner = None)
            .or_insert(Some(holder));
    }
    // The backends at once: the closer their reads, the likelier a cycle
    // seen is one.
    let reads = crate::exec::all_at_once(shared.pools.iter().map(|pool| lock_waits(pool, look)));
    let mut trxs = Vec::new();
    for read in reads.await {
        trxs.extend(read?);
    }
    Some(victims(&trxs, |backend, thread| {
        owners.get(&(backend, thread)).cloned().flatten()
    }))
}

/// A backend's transactions and their lock waits, read in a transaction of
/// the reader's own, whose row with this look's statement proves the rows
/// were made for this read; `None` where they were not (another reader
/// read within 100 ms). A backend that cannot be read shows no waits.
async fn lock_waits(pool: &crate::backend::Pool, look: u64) -> Option<Vec<ServerTrx>> {
    let backend = pool.id();
    let bucket = pool.bucket(ConnKey::service());
    let Ok(mut lease) = pool.acquire(&bucket, None).await else {
        return Some(Vec::new());
    };
    let reader = lease.conn.thread_id;
    let read = LOCK_WAITS.replace("{look}", &look.to_string());
    let mut rows = None;
    for sql in [
        "START TRANSACTION WITH CONSISTENT SNAPSHOT",
        &read,
        "COMMIT",
    ] {
        match lease.conn.query(sql).await {
            Ok(Ok(answer)) => rows = rows.or((sql == read).then_some(answer)),
            Ok(Err(refused)) => {
                tracing::warn!(backend, "cannot read lock waits: {}", refused.message);
                pool.release_to(&bucket, lease.conn);
                return Some(Vec::new());
            }
            Err(e) => {
                tracing::debug!(backend, "cannot read lock waits: {e}");
                return Some(Vec::new());
            }
        }
    }
    pool.release_to(&bucket, lease.conn);
    let rows = rows.unwrap_or_default();
    let marker = format!("SELECT {look} AS look");
    let fresh = rows.iter().any(|row| {
        row.get(1).and_then(number) == Some(u64::from(reader))
            && row
                .get(4)
                .and_then(|q| q.as_deref())
                .is_some_and(|q| q.starts_with(marker.as_bytes()))
    });
    fresh.then(|| server_trxs(backend, &rows))
}

fn server_trxs(backend: u32, rows: &[Vec<TextValue>]) -> Vec<ServerTrx> {
    let mut by_thread: HashMap<u32, ServerTrx> = HashMap::new();
    for row in rows {
        let [_, thread, weight, blocker, _] = row.as_slice() else {
            continue;
        };
        let Some(thread) = number(thread) else {
            continue;
        };
        let trx = by_thread.entry(thread as u32).or_insert_with(|| ServerTrx {
            backend,
            thread: thread as u32,
            weight: number(weight).unwrap_or(0),
            waits_for: Vec::new(),
        });
        if let Some(blocker) = number(blocker) {
            trx.waits_for.push(blocker as u32);
        }
    }
    by_thread.into_values().collect()
}

fn number(value: &TextValue) -> Option<u64> {
    std::str::from_utf8(value.as_deref()?).ok()?.parse().ok()
}

async fn end(shared: &Shared, sessions: &[(u32, Arc<SessionHandle>)], victim: &Victim<Holder>) {
    let Some((_, session)) = sessions.iter().find(|(id, _)| *id == victim.session.1) else {
        return;
    };
    tracing::info!(
        connection_id = victim.session.1,
        backend = victim.backend,
        thread_id = victim.thread,
        "deadlock through several backends: this transaction is rolled back"
    );
    Counters::add(&shared.counters.deadlocks, 1);
    // First: the lost connection then reads as the deadlock it is.
    session.mark_deadlocked();
    crate::session::kill_backend_thread(
        shared,
        victim.backend,
        victim.thread,
        KillScope::Connection,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_of_the_same_backends_read_a_turn_apart() {
        let names = ["b-2", "a-1", "c-3"];
        for start_ms in [0u64, 1, 139, 140, 141, 1_000_003, 1_764_000_000_123] {
            let now = Duration::from_millis(start_ms);
            let mut reads: Vec<Duration> = names
                .iter()
                .map(|me| {
                    let others = names.iter().copied().filter(|n| n != me);
                    next_turn(now, me, others)
                })
                .collect();
            assert!(reads.iter().all(|&at| at > now && at <= now + TURN * 3));
            reads.sort();
            for pair in reads.windows(2) {
                assert_eq!(pair[1] - pair[0], TURN, "from {start_ms} ms: {reads:?}");
            }
        }
    }

    #[test]
    fn an_instance_alone_reads_at_the_next_turn() {
        let now = Duration::from_millis(1_000);
        let at = next_turn(now, "a-1", std::iter::empty());
        assert!(at > now && at <= now + TURN);
    }
}

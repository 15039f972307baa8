//! The deadlock detector: lock waits that form a cycle through several
//! backends, which no server sees alone (`hscale_transaction::deadlock`).
//! It looks only while some client's command has been running since its
//! last look, reads each backend's transactions and lock waits, and ends the
//! transaction a cycle names twice in a row — its waiting connection
//! killed, the rest rolled back by its session, the client answered 1213 as
//! MariaDB answers a deadlock on one server.

use std::collections::HashMap;
use std::sync::Arc;

use hscale_planner::KillScope;
use hscale_transaction::deadlock::{victims, ServerTrx, Victim};
use hscale_wire::resultset::TextValue;

use crate::backend::ConnKey;
use crate::shared::{Counters, SessionHandle, Shared};

/// Each transaction with the threads whose locks it waits for: a row per
/// wait, one with NULL for a transaction that waits for none.
const LOCK_WAITS: &str = "SELECT t.trx_mysql_thread_id, t.trx_weight, b.trx_mysql_thread_id \
     FROM information_schema.INNODB_TRX t \
     LEFT JOIN information_schema.INNODB_LOCK_WAITS w ON w.requesting_trx_id = t.trx_id \
     LEFT JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id";

const MIN_PERIOD: std::time::Duration = std::time::Duration::from_millis(110);

pub async fn detect_loop(shared: Arc<Shared>) {
    let Some(period) = shared.deadlock_check else {
        return;
    };
    // InnoDB renews what INNODB_TRX shows only when it was last read more
    // than 100 ms ago: looking more often would show it frozen.
    let mut tick = tokio::time::interval(period.max(MIN_PERIOD));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut running_before: HashMap<u32, u64> = HashMap::new();
    let mut suspected: Vec<Victim> = Vec::new();
    loop {
        tick.tick().await;
        let sessions = shared.sessions.all();
        let running: HashMap<u32, u64> = sessions
            .iter()
            .filter_map(|(id, s)| Some((*id, s.running_command()?)))
            .collect();
        // A command seen at the last look too has run at least a period:
        // only then are the backends asked.
        let waited = running
            .iter()
            .any(|(id, command)| running_before.get(id) == Some(command));
        running_before = running;
        if !waited {
            suspected.clear();
            continue;
        }
        let found = find(&shared, &sessions).await;
        // Each backend was read at its own moment: a cycle is one only if
        // the next look shows it again.
        let (confirmed, seen_once): (Vec<Victim>, Vec<Victim>) =
            found.into_iter().partition(|v| suspected.contains(v));
        for victim in &confirmed {
            end(&shared, &sessions, victim).await;
        }
        suspected = seen_once;
    }
}

async fn find(shared: &Shared, sessions: &[(u32, Arc<SessionHandle>)]) -> Vec<Victim> {
    // A thread two sessions claim (one gave it back to the pool during its
    // command, the other took it) belongs to neither: no edge, no victim.
    let mut owners: HashMap<(u32, u32), Option<u32>> = HashMap::new();
    for (id, session) in sessions {
        for thread in session.holding() {
            owners
                .entry(thread)
                .and_modify(|owner| *owner = None)
                .or_insert(Some(*id));
        }
    }
    let mut trxs = Vec::new();
    for pool in shared.pools.iter() {
        trxs.extend(lock_waits(pool).await);
    }
    victims(&trxs, |backend, thread| {
        owners.get(&(backend, thread)).copied().flatten()
    })
}

async fn lock_waits(pool: &crate::backend::Pool) -> Vec<ServerTrx> {
    let backend = pool.id();
    let bucket = pool.bucket(ConnKey::service());
    let Ok(mut lease) = pool.acquire(&bucket, None).await else {
        return Vec::new();
    };
    let rows = match lease.conn.query(LOCK_WAITS).await {
        Ok(Ok(rows)) => {
            pool.release_to(&bucket, lease.conn);
            rows
        }
        Ok(Err(refused)) => {
            tracing::warn!(backend, "cannot read lock waits: {}", refused.message);
            pool.release_to(&bucket, lease.conn);
            return Vec::new();
        }
        Err(e) => {
            tracing::debug!(backend, "cannot read lock waits: {e}");
            return Vec::new();
        }
    };
    let mut by_thread: HashMap<u32, ServerTrx> = HashMap::new();
    for row in rows {
        let [thread, weight, blocker] = row.as_slice() else {
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

async fn end(shared: &Shared, sessions: &[(u32, Arc<SessionHandle>)], victim: &Victim) {
    let Some((_, session)) = sessions.iter().find(|(id, _)| *id == victim.session) else {
        return;
    };
    tracing::info!(
        connection_id = victim.session,
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

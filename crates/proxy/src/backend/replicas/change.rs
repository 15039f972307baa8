//! A new writer for a backend: HSCALE SWITCHOVER to a replica in step (the
//! old writer made read-only first, nothing acknowledged lost), and the
//! automatic failover of a writer gone past `failover_after_ms`, by the one
//! instance that holds the backend's failover lock.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::monitor::check;
use super::{most_advanced, Writer};
use crate::backend::{BackendConn, ConnKey, Pool, Rows};

/// How long a switchover waits for the new writer to apply the old one's
/// last transaction before it gives up and leaves the old one the writer.
pub(super) const CATCH_UP_S: u64 = 10;

/// How long a switchover waits for the statements in flight on the old
/// writer before it makes it read-only.
pub(super) const IN_FLIGHT_WAIT: Duration = Duration::from_millis(500);

/// What a switchover did: the old and new writer, and how long statements
/// that needed the writer waited.
pub struct Switched {
    pub from: String,
    pub to: String,
    pub pause: Duration,
}

/// HSCALE SWITCHOVER: `to`, a replica in step, becomes the writer, with no
/// acknowledged write lost. Statements that need the writer wait from the
/// start (new ones for a writer, those in flight finish first: setting
/// read_only waits for them); the old writer is made read-only, `to`
/// applies everything it wrote, is made writable, and the other hosts,
/// the old writer too, replicate from it.
/// `in_flight`: whether a statement of this instance may still be on its
/// way to the old writer on a connection taken before the pause began.
pub async fn switchover(
    pool: &Arc<Pool>,
    to: &str,
    in_flight: impl Fn() -> bool,
) -> Result<Switched, String> {
    let set = &pool.replicas;
    let Some(target) = set.hosts.iter().position(|h| h == to) else {
        return Err(format!(
            "{to} is not a host of backend {} ({})",
            pool.config.id,
            set.hosts.join(", ")
        ));
    };
    let Writer::At { host: from, .. } = set.writer() else {
        return Err(format!(
            "backend {} has no writer to switch from",
            pool.config.id
        ));
    };
    if from == target {
        return Err(format!(
            "{to} is the writer of backend {} already",
            pool.config.id
        ));
    }
    let replica = set.health()[target].replication.clone().unwrap_or_default();
    if !(replica.io_running && replica.sql_running) {
        return Err(format!(
            "{to} does not replicate (IO and SQL threads): it cannot take over"
        ));
    }
    let Some((host, port)) = to.rsplit_once(':') else {
        return Err(format!("{to} is not host:port: replicas cannot reach it"));
    };
    let started = Instant::now();
    set.switching.store(true, Ordering::Release);
    set.publish(Writer::None);
    // Such a statement would meet read_only and fail; one that takes longer
    // than this ends as its transaction's must once the writer changed.
    let quiet = Instant::now() + IN_FLIGHT_WAIT;
    while in_flight() && Instant::now() < quiet {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let result = hand_over(pool, from, target, (host, port)).await;
    if let Err(e) = &result {
        tracing::warn!(backend = pool.config.id, "switchover to {to} failed: {e}");
    }
    set.switching.store(false, Ordering::Release);
    check(pool).await;
    result.map(|()| Switched {
        from: set.hosts[from].clone(),
        to: to.to_string(),
        pause: started.elapsed(),
    })
}

/// Runs one of hscale's own statements; what failed, with the statement.
pub(super) async fn run(conn: &mut BackendConn, sql: &str) -> Result<Rows, String> {
    match conn.query(sql).await {
        Ok(Ok(rows)) => Ok(rows),
        Ok(Err(e)) => Err(format!("{sql}: {}", e.message)),
        Err(e) => Err(format!("{sql}: {e}")),
    }
}

/// The first value of an answer, as text.
pub(super) fn first_value(rows: &Rows) -> Option<String> {
    let value = rows.first()?.first()?.as_ref()?;
    Some(String::from_utf8_lossy(value).into_owned())
}

pub(super) async fn hand_over(
    pool: &Arc<Pool>,
    from: usize,
    target: usize,
    address: (&str, &str),
) -> Result<(), String> {
    let mut old = open(pool, from).await?;
    // Waits for the statements and commits in flight there, not longer.
    run(&mut old, "SET SESSION lock_wait_timeout = 5").await?;
    run(&mut old, "SET GLOBAL read_only = 1").await?;
    let position =
        first_value(&run(&mut old, "SELECT @@global.gtid_binlog_pos").await?).unwrap_or_default();
    if let Err(e) = promote(pool, target, &position).await {
        run(&mut old, "SET GLOBAL read_only = 0").await?;
        return Err(format!("{e}; the writer stays"));
    }
    follow(pool, target, address, &[]).await?;
    acknowledged_soon(pool, target).await;
    Ok(())
}

/// How long a new writer that commits semi-synchronously is given to see
/// a replica that acknowledges its commits.
pub(super) const ACKNOWLEDGER_WAIT: Duration = Duration::from_millis(1000);

/// Returns once `target` has a replica that acknowledges its commits, if
/// it commits semi-synchronously (at most `ACKNOWLEDGER_WAIT`): a replica
/// pointed at it registers a moment after its START SLAVE, and a commit
/// made before then waits `rpl_semi_sync_master_timeout` for an
/// acknowledgement no one sends (2 s and more; 10 s by default).
pub(super) async fn acknowledged_soon(pool: &Pool, target: usize) {
    let Ok(mut conn) = open(pool, target).await else {
        return;
    };
    let ask = "SELECT @@global.rpl_semi_sync_master_enabled, (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_CLIENTS')";
    let deadline = Instant::now() + ACKNOWLEDGER_WAIT;
    while Instant::now() < deadline {
        let Ok(rows) = run(&mut conn, ask).await else {
            return;
        };
        let value = |column: usize| {
            let value = rows.first()?.get(column)?.as_ref()?;
            Some(String::from_utf8_lossy(value).into_owned())
        };
        let semi_sync = value(0).as_deref() == Some("1");
        let clients: u64 = value(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        if !semi_sync || clients > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub(super) async fn open(pool: &Pool, host: usize) -> Result<Box<BackendConn>, String> {
    pool.open_own_to(host, ConnKey::service())
        .await
        .map_err(|e| e.to_string())
}

/// `target` applies everything up to `position`, stops replicating and
/// takes writes.
pub(super) async fn promote(pool: &Pool, target: usize, position: &str) -> Result<(), String> {
    let mut new = open(pool, target).await?;
    let wait = format!("SELECT MASTER_GTID_WAIT('{position}', {CATCH_UP_S})");
    if first_value(&run(&mut new, &wait).await?).as_deref() != Some("0") {
        return Err(format!(
            "{} did not apply {position} within {CATCH_UP_S} s",
            pool.replicas.hosts[target]
        ));
    }
    for sql in ["STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0"] {
        run(&mut new, sql).await?;
    }
    Ok(())
}

/// Every host but `target` and `skip` replicates from `target`, all at
/// once; one that is down now follows once a tool or a person points it
/// there. Answers once one of them follows: the new writer's
/// semi-synchronous commits need one replica to acknowledge them, and a
/// replica's STOP SLAVE can take seconds (a semi-synchronous replica of a
/// former writer, 2 s on MariaDB 10.11), which writes need not wait for.
pub(super) async fn follow(
    pool: &Arc<Pool>,
    target: usize,
    (host, port): (&str, &str),
    skip: &[usize],
) -> Result<(), String> {
    let config = &pool.config;
    let user = config.replication_user.as_deref().unwrap_or(&config.user);
    let password = config
        .replication_password
        .as_deref()
        .unwrap_or(&config.password);
    let change = format!(
        "CHANGE MASTER TO MASTER_HOST = '{}', MASTER_PORT = {}, MASTER_USER = '{}', MASTER_PASSWORD = '{}', MASTER_USE_GTID = slave_pos",
        host.replace('\'', "''"),
        port.parse::<u16>().map_err(|_| format!("'{port}' is not a port"))?,
        user.replace('\'', "''"),
        password.replace('\'', "''"),
    );
    let others = (0..pool.replicas.hosts.len()).filter(|h| *h != target && !skip.contains(h));
    let (done, mut followed) = tokio::sync::mpsc::unbounded_channel();
    for other in others {
        let (pool, change, done) = (pool.clone(), change.clone(), done.clone());
        // Spawned, not only awaited: none is left stopped half-way.
        tokio::spawn(async move {
            let _ = done.send(point_at(&pool, other, &change).await);
        });
    }
    drop(done);
    while let Some(pointed) = followed.recv().await {
        if pointed {
            break;
        }
    }
    Ok(())
}

/// `host` replicates as `change` says; whether it does.
pub(super) async fn point_at(pool: &Pool, host: usize, change: &str) -> bool {
    let Ok(mut conn) = open(pool, host).await else {
        return false;
    };
    for sql in ["STOP SLAVE", change, "START SLAVE"] {
        if let Err(e) = run(&mut conn, sql).await {
            let address = &pool.replicas.hosts[host];
            tracing::warn!(backend = pool.config.id, host = %address, "pointing at the new writer: {e}");
            return false;
        }
    }
    true
}

/// Promotes the replica that received most of the lost writer's
/// transactions, once it applied them, and points the others at it; the
/// lost writer is fenced. One instance does it: the one that holds the
/// backend's failover lock (`elected`).
pub(super) async fn fail_over(
    pool: &Arc<Pool>,
    lost: usize,
    main: &Arc<Pool>,
) -> Result<(), String> {
    let Some(_lock) = elected(pool, lost, main).await? else {
        return Ok(());
    };
    // Another instance may have done it meanwhile.
    check(pool).await;
    if pool.replicas.lost_for(Duration::ZERO) != Some(lost) {
        return Ok(());
    }
    let health = pool.replicas.health();
    let Some(target) = most_advanced(&health, lost) else {
        return Err("no replica to promote (none reachable and replicating)".into());
    };
    let to = pool.replicas.hosts[target].clone();
    let Some((host, port)) = to.rsplit_once(':') else {
        return Err(format!("{to} is not host:port: replicas cannot reach it"));
    };
    tracing::warn!(backend = pool.config.id, from = %pool.replicas.hosts[lost], to = %to, "failover: promoting");
    let received = health[target]
        .replication
        .as_ref()
        .map(|r| r.received.clone())
        .unwrap_or_default();
    pool.replicas.fence(lost);
    promote(pool, target, &received).await?;
    follow(pool, target, (host, port), &[lost]).await?;
    acknowledged_soon(pool, target).await;
    check(pool).await;
    Ok(())
}

/// Whether this instance takes the backend's failover lock
/// (`GET_LOCK('hscale_failover_<id>')`): on the main backend, where every
/// instance meets; for the main backend itself, whose writer is the one
/// lost, on a majority of its other hosts, so that two instances never
/// both hold it. The lock lives as long as the connections returned.
pub(super) async fn elected(
    pool: &Arc<Pool>,
    lost: usize,
    main: &Arc<Pool>,
) -> Result<Option<Vec<Box<BackendConn>>>, String> {
    let take = format!("SELECT GET_LOCK('hscale_failover_{}', 0)", pool.config.id);
    if !Arc::ptr_eq(pool, main) {
        let mut lock = main
            .open_own(ConnKey::service())
            .await
            .map_err(|e| e.to_string())?;
        let taken = first_value(&run(&mut lock, &take).await?).as_deref() == Some("1");
        return Ok(taken.then(|| vec![lock]));
    }
    let others: Vec<usize> = (0..pool.replicas.hosts.len())
        .filter(|&h| h != lost)
        .collect();
    let mut held = Vec::new();
    for &host in &others {
        let Ok(mut conn) = open(pool, host).await else {
            continue;
        };
        if let Ok(rows) = run(&mut conn, &take).await {
            if first_value(&rows).as_deref() == Some("1") {
                held.push(conn);
            }
        }
    }
    Ok((held.len() * 2 > others.len()).then_some(held))
}

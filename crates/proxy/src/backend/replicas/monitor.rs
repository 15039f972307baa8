//! The backend's hosts checked every `monitor_ms`: each one's reachability,
//! read_only and replication, the writer elected from what was seen, a
//! fenced host that came back writable made read-only, a failover started
//! once the writer has been gone long enough.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hscale_wire::resultset::TextValue;

use super::change::{fail_over, open, run};
use super::{Health, Replication};
use crate::backend::{BackendConn, BackendError, ConnKey, Pool};

/// Checks the backend's hosts every `period`, as long as the process serves.
/// With `failover = "auto"`, fails over once the writer has been gone for
/// `failover_after_ms`; `main` holds the lock that elects the instance that
/// does.
pub async fn monitor(pool: Arc<Pool>, period: Duration, main: Arc<Pool>) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        check(&pool).await;
        if pool.config.failover == crate::config::Failover::Auto {
            fence(&pool).await;
            let after = Duration::from_millis(pool.config.failover_after_ms);
            if let Some(lost) = pool.replicas.lost_for(after) {
                if let Err(e) = fail_over(&pool, lost, &main).await {
                    tracing::warn!(backend = pool.config.id, "failover: {e}");
                }
            }
        }
    }
}

/// A fenced host seen writable is made read-only: it came back after a
/// failover took its place.
pub(super) async fn fence(pool: &Pool) {
    let (fenced, health) = (pool.replicas.fenced(), pool.replicas.health());
    for host in
        (0..fenced.len()).filter(|&h| fenced[h] && health[h].reachable && !health[h].read_only)
    {
        if let Ok(mut conn) = open(pool, host).await {
            let _ = run(&mut conn, "SET GLOBAL read_only = 1").await;
            tracing::warn!(backend = pool.config.id, host = %pool.replicas.hosts[host], "a fenced host came back writable: made read-only");
        }
    }
}

/// Checks the hosts now, in the background: after another instance's
/// switchover lifted its hold, the new writer is found at once rather
/// than at the next period.
pub fn check_soon(pool: &Arc<Pool>) {
    let pool = pool.clone();
    tokio::spawn(async move { check(&pool).await });
}

/// Checks every host at once, then elects the writer.
pub(super) async fn check(pool: &Pool) {
    let set = &pool.replicas;
    let mut connections = set.monitor.lock().await;
    // A check that waits longer than a period on one host would hold up the
    // others' next one: a host that slow counts as unreachable.
    let limit = pool.connect_timeout;
    let checks = connections
        .iter_mut()
        .enumerate()
        .map(|(host, conn)| async move {
            match tokio::time::timeout(limit, check_host(pool, host, conn)).await {
                Ok(Ok(health)) => health,
                Ok(Err(e)) => {
                    *conn = None;
                    unreachable(e.to_string())
                }
                Err(_) => {
                    *conn = None;
                    unreachable(format!("no answer within {} ms", limit.as_millis()))
                }
            }
        });
    let seen = crate::exec::all_at_once(checks).await;
    set.record(seen);
}

pub(super) fn unreachable(error: String) -> Health {
    Health {
        error: Some(error),
        checked: Some(Instant::now()),
        ..Health::default()
    }
}

pub(super) async fn check_host(
    pool: &Pool,
    host: usize,
    conn: &mut Option<Box<BackendConn>>,
) -> Result<Health, BackendError> {
    if conn.is_none() {
        *conn = Some(pool.connect_monitor(host, ConnKey::service()).await?);
    }
    let conn = conn.as_mut().expect("connected above");
    let refused = |e: hscale_wire::packets::ErrorPacket| e.message;
    let (_, rows) = conn
        .query_named("SELECT @@global.read_only, @@global.gtid_binlog_pos, @@global.gtid_slave_pos")
        .await?
        .map_err(|e| BackendError::Refused {
            backend: pool.config.id,
            message: refused(e),
        })?;
    let row = rows.first().map(Vec::as_slice).unwrap_or_default();
    let text = |i: usize| {
        row.get(i)
            .cloned()
            .flatten()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default()
    };
    let mut health = Health {
        reachable: true,
        read_only: text(0) != "0",
        gtid_binlog: text(1),
        gtid_slave: text(2),
        checked: Some(Instant::now()),
        ..Health::default()
    };
    match conn.query_named("SHOW SLAVE STATUS").await? {
        Ok((names, rows)) => {
            health.replication = rows.first().map(|row| replication(&names, row));
        }
        // Without SLAVE MONITOR (REPLICATION CLIENT) hscale sees no lag.
        Err(e) => health.error = Some(refused(e)),
    }
    Ok(health)
}

/// SHOW SLAVE STATUS's row, read by column name.
pub(super) fn replication(names: &[String], row: &[TextValue]) -> Replication {
    let value = |name: &str| {
        names
            .iter()
            .position(|n| n == name)
            .and_then(|i| row.get(i).cloned().flatten())
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    };
    Replication {
        source: format!(
            "{}:{}",
            value("Master_Host").unwrap_or_default(),
            value("Master_Port").unwrap_or_default()
        ),
        io_running: value("Slave_IO_Running").as_deref() == Some("Yes"),
        sql_running: value("Slave_SQL_Running").as_deref() == Some("Yes"),
        lag_s: value("Seconds_Behind_Master").and_then(|s| s.parse().ok()),
        received: value("Gtid_IO_Pos").unwrap_or_default(),
    }
}

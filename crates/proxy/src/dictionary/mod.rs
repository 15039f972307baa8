//! The partition dictionary as this instance holds it: an immutable snapshot
//! swapped whole when the version in schema `hscale` changes, polled every
//! `refresh_ms`, with a heartbeat that tells other instances which version
//! this one routes by. An instance that could not read the dictionary for
//! `lease_ms` stops serving partitioned tables.

pub mod moves;
pub mod sequences;
pub mod store;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hscale_planner::Dictionary;
use hscale_wire::CapabilityFlags;

use crate::backend::{BackendConn, ConnKey};
use crate::error::ProxyError;
use crate::shared::Shared;

pub struct DictionaryHandle {
    current: ArcSwap<Dictionary>,
    /// Milliseconds after `started` of the last successful read; 0: never.
    last_read_ms: AtomicU64,
    /// Whether the last read is within the lease, as the refresh loop last
    /// saw: the hot path reads a flag, not the clock.
    fresh: AtomicBool,
    started: Instant,
    pub schema: String,
    pub refresh: Duration,
    pub lease: Duration,
    /// This instance's name in the heartbeat table.
    pub instance: String,
}

impl DictionaryHandle {
    pub fn new(schema: String, refresh: Duration, lease: Duration) -> DictionaryHandle {
        let instance = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
        DictionaryHandle {
            current: ArcSwap::from_pointee(Dictionary::default()),
            last_read_ms: AtomicU64::new(0),
            fresh: AtomicBool::new(false),
            started: Instant::now(),
            schema,
            refresh,
            lease,
            instance,
        }
    }

    /// The current snapshot; a guard, not a reference count, so that workers
    /// do not pass the count's cache line between them on every statement.
    pub fn snapshot(&self) -> arc_swap::Guard<Arc<Dictionary>> {
        self.current.load()
    }

    /// Whether the snapshot was confirmed within the lease (as of the last
    /// refresh tick, at most `refresh_ms` ago).
    pub fn fresh(&self) -> bool {
        self.fresh.load(Ordering::Relaxed)
    }

    /// Called on every refresh tick, successful or not.
    fn check_lease(&self) {
        let last = self.last_read_ms.load(Ordering::Relaxed);
        let fresh =
            last != 0 && self.now_ms().saturating_sub(last) <= self.lease.as_millis() as u64;
        if self.fresh.swap(fresh, Ordering::Relaxed) && !fresh {
            tracing::error!(
                "the dictionary was not read within its lease: partitioned tables are not served"
            );
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64 + 1
    }

    fn confirmed(&self) {
        self.last_read_ms.store(self.now_ms(), Ordering::Relaxed);
        self.fresh.store(true, Ordering::Relaxed);
    }

    fn install(&self, dictionary: Dictionary) {
        if dictionary.version != self.current.load().version {
            tracing::info!(
                version = dictionary.version,
                tables = dictionary.tables().len(),
                "dictionary loaded"
            );
        }
        self.current.store(Arc::new(dictionary));
    }
}

/// A connection of hscale's own to a backend, for the dictionary and admin
/// commands; it is closed, never pooled, when dropped.
pub async fn own_connection(shared: &Shared, slot: usize) -> Result<Box<BackendConn>, ProxyError> {
    let key = ConnKey::for_client(CapabilityFlags::empty(), 45, false);
    Ok(shared.pools[slot].open_own(key).await?)
}

/// Creates the schema if needed, finishes or undoes moves a dead instance
/// left behind, and loads the first snapshot.
pub async fn open(shared: &Shared) -> Result<(), ProxyError> {
    let mut conn = own_connection(shared, shared.main).await?;
    store::ensure_schema(&mut conn, &shared.dictionary.schema).await?;
    moves::recover(shared, &mut conn).await?;
    crate::admin::schema::recover(shared, &mut conn).await?;
    reload_with(shared, &mut conn).await
}

/// Reads the version and, when it changed, the whole dictionary; then the
/// heartbeat.
pub async fn reload_with(shared: &Shared, conn: &mut BackendConn) -> Result<(), ProxyError> {
    let handle = &shared.dictionary;
    let version = store::read_version(conn, &handle.schema).await?;
    if version != handle.snapshot().version {
        handle.install(store::load(conn, &handle.schema).await?);
    }
    let loaded = handle.snapshot().version;
    store::heartbeat(conn, &handle.schema, &handle.instance, loaded).await?;
    handle.confirmed();
    Ok(())
}

/// Reloads now, on a connection of its own (HSCALE REFRESH, after a change).
pub async fn reload(shared: &Shared) -> Result<(), ProxyError> {
    let mut conn = own_connection(shared, shared.main).await?;
    reload_with(shared, &mut conn).await
}

/// Polls the version every `refresh_ms` for as long as the proxy serves.
pub async fn refresh_loop(shared: Arc<Shared>) {
    let mut conn: Option<Box<BackendConn>> = None;
    let mut interval = tokio::time::interval(shared.dictionary.refresh);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        if conn.is_none() {
            conn = own_connection(&shared, shared.main).await.ok();
        }
        if let Some(c) = conn.as_mut() {
            if let Err(e) = reload_with(&shared, c).await {
                tracing::warn!("cannot read the dictionary: {e}");
                conn = None;
            }
        }
        shared.dictionary.check_lease();
    }
}

/// Removes this instance's heartbeat at shutdown, so that admin commands do
/// not wait for it. Best effort: a heartbeat left behind expires with its lease.
pub async fn leave(shared: &Shared) {
    let handle = &shared.dictionary;
    if let Ok(mut conn) = own_connection(shared, shared.main).await {
        let sql = format!(
            "DELETE FROM {}.instances WHERE id = {}",
            store::ident(&handle.schema),
            store::text_literal(&handle.instance)
        );
        let _ = store::exec(&mut conn, &sql).await;
    }
}

/// After a change at `version`: waits until every live instance has loaded
/// it, or until the lease is over (an instance that has not read the
/// dictionary for that long has stopped serving partitioned tables).
pub async fn wait_for_instances(
    shared: &Shared,
    conn: &mut BackendConn,
    version: u64,
) -> Result<(), ProxyError> {
    let handle = &shared.dictionary;
    let deadline = Instant::now() + handle.lease + handle.refresh;
    loop {
        let behind = store::instances_behind(
            conn,
            &handle.schema,
            &handle.instance,
            version,
            handle.lease.as_millis() as u64,
        )
        .await?;
        if behind.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                ?behind,
                version,
                "instances did not load the dictionary within their lease"
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_not_confirmed_within_the_lease_is_not_served() {
        let handle = DictionaryHandle::new(
            "hscale".into(),
            Duration::from_millis(1),
            Duration::from_millis(20),
        );
        assert!(!handle.fresh(), "never read");
        handle.confirmed();
        handle.check_lease();
        assert!(handle.fresh());
        std::thread::sleep(Duration::from_millis(30));
        handle.check_lease();
        assert!(!handle.fresh(), "lease over");
        handle.confirmed();
        assert!(handle.fresh(), "read again");
    }
}

//! A bounded pool of connections to one backend. Idle connections wait in
//! lock-free queues, one per `ConnKey`; a session looks its queue up once and
//! then takes and returns connections without a lock.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use tokio::sync::{Notify, Semaphore};

use super::{BackendConn, BackendError, ConnKey, ConnMark};
use crate::config::BackendConfig;

/// At most this many connections of hscale's own per backend.
const OWN_CONNECTIONS: usize = 8;

/// A connection idle longer than this is checked for a closed socket before use.
const STALE_CHECK_AFTER: Duration = Duration::from_millis(250);

/// The idle connections of one key.
#[derive(Clone)]
pub struct Bucket {
    pub key: ConnKey,
    idle: Arc<SegQueue<Box<BackendConn>>>,
}

pub struct Pool {
    pub config: BackendConfig,
    buckets: RwLock<HashMap<ConnKey, Bucket>>,
    /// One permit per open connection.
    slots: Arc<Semaphore>,
    /// Connections hscale opens for itself (dictionary, admin commands, row
    /// moves), apart from the clients' so that they never take a client's place.
    own_slots: Arc<Semaphore>,
    returned: Notify,
    connect_timeout: Duration,
    queue_timeout: Duration,
}

/// A connection on loan, and whether it was opened just now (rather than reused).
pub struct Lease {
    pub conn: Box<BackendConn>,
    pub fresh: bool,
}

impl Pool {
    pub fn new(config: BackendConfig, connect_timeout: Duration, queue_timeout: Duration) -> Pool {
        let slots = Arc::new(Semaphore::new(config.max_connections));
        Pool {
            config,
            buckets: RwLock::new(HashMap::new()),
            slots,
            own_slots: Arc::new(Semaphore::new(OWN_CONNECTIONS)),
            returned: Notify::new(),
            connect_timeout,
            queue_timeout,
        }
    }

    pub fn id(&self) -> u32 {
        self.config.id
    }

    pub fn bucket(&self, key: ConnKey) -> Bucket {
        if let Some(b) = self
            .buckets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return b.clone();
        }
        let mut buckets = self.buckets.write().unwrap_or_else(|e| e.into_inner());
        buckets
            .entry(key)
            .or_insert_with(|| Bucket {
                key,
                idle: Arc::new(SegQueue::new()),
            })
            .clone()
    }

    /// An idle connection of the bucket's key, else a new one, else waits for one.
    pub async fn acquire(&self, bucket: &Bucket) -> Result<Lease, BackendError> {
        match take_idle(bucket) {
            Some(conn) => Ok(Lease { conn, fresh: false }),
            None => self.acquire_slow(bucket).await,
        }
    }

    async fn acquire_slow(&self, bucket: &Bucket) -> Result<Lease, BackendError> {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.queue_timeout;
        loop {
            let returned = self.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            if let Some(conn) = take_idle(bucket) {
                return Ok(Lease { conn, fresh: false });
            }
            if let Ok(permit) = self.slots.clone().try_acquire_owned() {
                return self.open(bucket.key, permit).await;
            }
            if self.evict_idle_of_other_keys(bucket.key) {
                continue;
            }
            tokio::select! {
                _ = &mut returned => {}
                permit = self.slots.clone().acquire_owned() => {
                    let permit = permit.expect("the pool never closes its semaphore");
                    return self.open(bucket.key, permit).await;
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(BackendError::PoolExhausted {
                        backend: self.config.id,
                        waited_ms: started.elapsed().as_millis() as u64,
                        max: self.config.max_connections,
                    });
                }
            }
        }
    }

    /// A new connection, bypassing idle ones (after a reused one proved dead).
    pub async fn acquire_new(&self, bucket: &Bucket) -> Result<Lease, BackendError> {
        match self.slots.clone().try_acquire_owned() {
            Ok(permit) => self.open(bucket.key, permit).await,
            Err(_) => {
                self.evict_idle_of_other_keys(bucket.key);
                while bucket.idle.pop().is_some() {}
                self.acquire(bucket).await
            }
        }
    }

    /// Opens a connection without a database: the session selects it with
    /// COM_INIT_DB, so that an unknown database is the client's error (1049)
    /// rather than a failed backend login.
    async fn open(
        &self,
        key: ConnKey,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<Lease, BackendError> {
        let conn = BackendConn::connect(&self.config, key, self.connect_timeout, permit).await?;
        tracing::debug!(backend = self.config.id, "opened backend connection");
        Ok(Lease { conn, fresh: true })
    }

    /// A new connection for hscale's own use, outside the clients' pool; it
    /// is closed when dropped.
    pub async fn open_own(&self, key: ConnKey) -> Result<Box<BackendConn>, BackendError> {
        let wait = self.own_slots.clone().acquire_owned();
        let permit = tokio::time::timeout(self.queue_timeout, wait)
            .await
            .map_err(|_| BackendError::PoolExhausted {
                backend: self.config.id,
                waited_ms: self.queue_timeout.as_millis() as u64,
                max: OWN_CONNECTIONS,
            })?
            .expect("the pool never closes its semaphore");
        BackendConn::connect(&self.config, key, self.connect_timeout, permit).await
    }

    /// Returns a healthy connection to the idle queue of its current key.
    pub fn release(&self, mut conn: Box<BackendConn>) {
        conn.idle_since = Instant::now();
        let bucket = self.bucket(conn.key);
        bucket.idle.push(conn);
        self.returned.notify_one();
    }

    /// Returns a connection to the bucket the caller already holds for its key.
    pub fn release_to(&self, bucket: &Bucket, mut conn: Box<BackendConn>) {
        if conn.key != bucket.key {
            return self.release(conn);
        }
        conn.idle_since = Instant::now();
        bucket.idle.push(conn);
        self.returned.notify_one();
    }

    /// The idle connection `mark` names, if no one ran a command on it since.
    /// Rare (ROW_COUNT() and FOUND_ROWS()), so a walk through the queue will do;
    /// the others go back to its end.
    pub fn take_marked(&self, bucket: &Bucket, mark: ConnMark) -> Option<Box<BackendConn>> {
        let mut found = None;
        for _ in 0..bucket.idle.len() {
            let Some(conn) = bucket.idle.pop() else { break };
            if conn.mark() == mark && found.is_none() {
                found = Some(conn);
            } else {
                bucket.idle.push(conn);
                // A client may have looked while this one was out of the queue.
                self.returned.notify_one();
            }
        }
        found
    }

    /// Closes one idle connection of another key to free its slot.
    fn evict_idle_of_other_keys(&self, key: ConnKey) -> bool {
        let buckets = self.buckets.read().unwrap_or_else(|e| e.into_inner());
        for (k, bucket) in buckets.iter() {
            if *k != key {
                if let Some(conn) = bucket.idle.pop() {
                    drop(conn);
                    return true;
                }
            }
        }
        false
    }

    /// Connections open now, idle or in use.
    pub fn open_connections(&self) -> usize {
        self.config.max_connections - self.slots.available_permits()
    }

    /// Connections waiting in the pool for a client.
    pub fn idle_connections(&self) -> usize {
        let buckets = self.buckets.read().unwrap_or_else(|e| e.into_inner());
        buckets.values().map(|b| b.idle.len()).sum()
    }
}

/// An idle connection of the bucket that is still alive.
fn take_idle(bucket: &Bucket) -> Option<Box<BackendConn>> {
    while let Some(conn) = bucket.idle.pop() {
        if conn.idle_since.elapsed() > STALE_CHECK_AFTER && conn.stream.get_ref().is_stale() {
            continue;
        }
        return Some(conn);
    }
    None
}

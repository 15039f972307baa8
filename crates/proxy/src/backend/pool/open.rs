//! Opening a backend connection: to the writer (waiting through a failover
//! up to `failover_wait_ms`), or to one host whatever its role, for the
//! monitor and hscale's own work; each under a permit of the semaphore it
//! counts against (the clients', hscale's own, the monitor's).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::{Lease, Pool, OWN_CONNECTIONS};
use crate::backend::conn::Login;
use crate::backend::{BackendConn, BackendError, ConnKey};

impl Pool {
    /// Opens a connection without a database: the session selects it with
    /// COM_INIT_DB, so that an unknown database is the client's error (1049)
    /// rather than a failed backend login.
    pub(super) async fn open(
        &self,
        key: ConnKey,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<Lease, BackendError> {
        let conn = self.connect(key, permit, &self.slots).await?;
        tracing::debug!(backend = self.config.id, "opened backend connection");
        Ok(Lease { conn })
    }

    /// A new connection for hscale's own use, outside the clients' pool; it
    /// is closed when dropped.
    pub async fn open_own(&self, key: ConnKey) -> Result<Box<BackendConn>, BackendError> {
        let permit = self.own_permit().await?;
        self.connect(key, permit, &self.own_slots).await
    }

    pub(super) async fn own_permit(
        &self,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, BackendError> {
        let wait = self.own_slots.clone().acquire_owned();
        Ok(tokio::time::timeout(self.queue_timeout, wait)
            .await
            .map_err(|_| BackendError::PoolExhausted {
                backend: self.config.id,
                waited_ms: self.queue_timeout.as_millis() as u64,
                max: OWN_CONNECTIONS,
            })?
            .expect("the pool never closes its semaphore"))
    }

    /// `open_own`, to one host of the replica set whatever its role.
    pub(in crate::backend) async fn open_own_to(
        &self,
        host: usize,
        key: ConnKey,
    ) -> Result<Box<BackendConn>, BackendError> {
        let permit = self.own_permit().await?;
        self.connect_to(host, key, permit).await
    }

    /// Logs in to the writer as the key's account. A writer of a replica
    /// set that cannot be reached is gone: the statement waits for the next
    /// one (the monitor sees it, a failover promotes a replica), as one
    /// does while there is none, up to `failover_wait_ms`. `slots`: where
    /// `permit` came from, for the next try's.
    pub(super) async fn connect(
        &self,
        key: ConnKey,
        mut permit: tokio::sync::OwnedSemaphorePermit,
        slots: &Arc<Semaphore>,
    ) -> Result<Box<BackendConn>, BackendError> {
        let started = Instant::now();
        loop {
            let (host, generation) = self.writer_host().await?;
            let error = match self.connect_to(host, key, permit).await {
                Ok(mut conn) => {
                    conn.generation = generation;
                    return Ok(conn);
                }
                Err(e) => e,
            };
            let unreachable = matches!(
                error,
                BackendError::Connect { .. } | BackendError::ConnectTimeout { .. }
            );
            if !unreachable || self.replicas.hosts.len() == 1 {
                return Err(error);
            }
            Box::pin(self.replaced(generation, self.failover_wait(started))).await?;
            permit = slots
                .clone()
                .acquire_owned()
                .await
                .expect("the pool never closes its semaphore");
        }
    }

    /// What is left of the backend's `failover_wait_ms` since `started`.
    pub(super) fn failover_wait(&self, started: Instant) -> Duration {
        Duration::from_millis(self.config.failover_wait_ms).saturating_sub(started.elapsed())
    }

    /// A connection of the monitor's to one host, whatever its role.
    pub(in crate::backend) async fn connect_monitor(
        &self,
        host: usize,
        key: ConnKey,
    ) -> Result<Box<BackendConn>, BackendError> {
        let permit = self
            .monitor_slots
            .clone()
            .acquire_owned()
            .await
            .expect("the pool never closes its semaphore");
        self.connect_to(host, key, permit).await
    }

    pub(super) async fn connect_to(
        &self,
        host: usize,
        key: ConnKey,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<Box<BackendConn>, BackendError> {
        let (user, secret) = self
            .accounts
            .login(&self.config, key.account)
            .map_err(|user| BackendError::NoSecret {
                backend: self.config.id,
                user,
            })?;
        let account = (user.as_str(), &secret);
        let tls = self.tls[host]
            .as_ref()
            .map_err(|reason| BackendError::Tls {
                backend: self.config.id,
                reason: reason.clone(),
            })?;
        let login = Login {
            config: &self.config,
            address: &self.replicas.hosts[host],
            account,
            tls: tls.as_ref(),
        };
        BackendConn::connect(login, key, self.connect_timeout, permit).await
    }
}

//! The moves this instance runs. Their heartbeats are the instance's, one
//! statement per sweep on the sweep's connection: a move's own connections
//! are all its work's, so however many it waits for, its heart beats. At
//! most `AT_ONCE` moves work at a time; the others wait their turn, their
//! hearts beating, so that a rebalance of many partitions through one
//! instance takes a bounded share of its connections to a backend.

use std::collections::HashMap;
use std::sync::Mutex;

use hscale_moves::MoveError;
use tokio::sync::{watch, Semaphore, SemaphorePermit};

use crate::backend::BackendConn;
use crate::dictionary::store::{self, exec};
use crate::error::ProxyError;

/// Moves one instance works on at once: each holds up to eight connections
/// of the instance's own on its source (`backend::pool::OWN_CONNECTIONS`).
pub const AT_ONCE: usize = 2;

/// Why the sweep stopped a move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Another instance took it over (its epoch is past this one's).
    Superseded,
    /// HSCALE CANCEL_MOVE asked it to stop before its switch.
    Cancelled,
}

/// A job by its id and its owner's epoch: a job this instance took over
/// from itself (it stalled past the lease) runs beside its superseded run.
type JobKey = (u64, u64);

pub struct RunningMoves {
    jobs: Mutex<HashMap<JobKey, watch::Sender<Option<Stop>>>>,
    turns: Semaphore,
}

impl Default for RunningMoves {
    fn default() -> RunningMoves {
        RunningMoves {
            jobs: Mutex::default(),
            turns: Semaphore::new(AT_ONCE),
        }
    }
}

/// A move's place among the running ones; it leaves when dropped.
pub struct Registered<'a> {
    running: &'a RunningMoves,
    key: JobKey,
    stop: watch::Receiver<Option<Stop>>,
}

impl RunningMoves {
    pub fn register(&self, job: u64, epoch: u64) -> Registered<'_> {
        let (sender, stop) = watch::channel(None);
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((job, epoch), sender);
        Registered {
            running: self,
            key: (job, epoch),
            stop,
        }
    }

    /// Waits until fewer than `AT_ONCE` moves work; the turn ends when the
    /// permit drops.
    pub async fn turn(&self) -> SemaphorePermit<'_> {
        self.turns
            .acquire()
            .await
            .expect("the semaphore of moves is never closed")
    }

    fn owned(&self) -> Vec<JobKey> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.keys().copied().collect()
    }

    fn stop(&self, key: JobKey, why: Stop) {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = jobs.get(&key) {
            sender.send_replace(Some(why));
        }
    }
}

impl Registered<'_> {
    /// Returns when the sweep found the job cancelled or taken over.
    pub async fn stopped(&mut self) -> ProxyError {
        let job = self.key.0;
        let why = self
            .stop
            .wait_for(Option::is_some)
            .await
            .map(|why| *why)
            .unwrap_or(Some(Stop::Superseded));
        match why {
            Some(Stop::Cancelled) => MoveError::Cancelled { job }.into(),
            _ => MoveError::Superseded { job }.into(),
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut jobs = self.running.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.remove(&self.key);
    }
}

/// Beats the heart of every move this instance runs, and stops those that
/// are cancelled or no longer its own (their epoch moved on).
pub async fn beat(
    running: &RunningMoves,
    conn: &mut BackendConn,
    jobs: &str,
) -> Result<(), ProxyError> {
    let owned = running.owned();
    if owned.is_empty() {
        return Ok(());
    }
    let pairs: Vec<String> = owned
        .iter()
        .map(|(id, epoch)| format!("({id}, {epoch})"))
        .collect();
    let ids: Vec<String> = owned.iter().map(|(id, _)| id.to_string()).collect();
    exec(
        conn,
        &format!(
            "UPDATE {jobs} SET heartbeat = NOW(6) WHERE (id, epoch) IN ({})",
            pairs.join(", ")
        ),
    )
    .await?;
    let states = exec(
        conn,
        &format!(
            "SELECT id, epoch, cancel AND phase IN ('copying', 'catching_up', 'fencing') FROM {jobs} WHERE id IN ({})",
            ids.join(", ")
        ),
    )
    .await?;
    for (id, epoch) in owned {
        let row = (0..states.len()).find(|&r| store::text(&states, r, 0) == id.to_string());
        let why = match row {
            None => Some(Stop::Superseded),
            Some(r) if store::text(&states, r, 1) != epoch.to_string() => Some(Stop::Superseded),
            Some(r) if store::text(&states, r, 2) == "1" => Some(Stop::Cancelled),
            Some(_) => None,
        };
        if let Some(why) = why {
            running.stop((id, epoch), why);
        }
    }
    Ok(())
}

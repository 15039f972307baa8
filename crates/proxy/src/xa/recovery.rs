//! Two-phase commit recovery, which every instance runs at start and then
//! periodically: `XA RECOVER` on each backend, and each prepared branch that
//! no running instance is finishing committed or rolled back as its
//! transaction's decision says (in the dictionary, or where its plain part
//! carried it); an abort decided where no owner can finish it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hscale_transaction::{resolve, statements, Decision, Found, Resolution, Xid};

use super::{
    decisions_table, insert_decision, lock, read_decisions, run_branch_statement, Recorded,
    ABORT_RETENTION, COMMIT_RETENTION,
};
use crate::backend::BackendConn;
use crate::dictionary::store::{decisions_ddl, decisions_proof_ddl, exec, ident, text};
use crate::error::ProxyError;
use crate::shared::Cluster;

/// Recovery, at start and then every `period`.
pub async fn recovery_loop(shared: Arc<Cluster>, period: Duration) {
    let mut failing = false;
    let mut connections = Connections::default();
    loop {
        match recover(&shared, &mut connections).await {
            Ok(left) => {
                shared.xa.unresolved.store(left, Ordering::Relaxed);
                failing = false;
            }
            // Said once, not every pass, while the dictionary is away.
            Err(e) if !failing => {
                tracing::warn!("two-phase commit recovery: {e}");
                failing = true;
            }
            Err(e) => tracing::debug!("two-phase commit recovery: {e}"),
        }
        tokio::time::sleep(period).await;
    }
}

/// Recovery's own connections, kept from one pass to the next: the
/// dictionary's, and one per backend (`None` until opened, or once lost).
#[derive(Default)]
pub struct Connections {
    dictionary: Option<Box<BackendConn>>,
    backends: HashMap<usize, Box<BackendConn>>,
    /// Backends other than the main one where the decisions table exists.
    tables_made: HashSet<usize>,
}

/// A transaction's decision where its plain part may have carried it:
/// a commit in either place; an abort only once the plain part's backend
/// has one (the fence against its commit).
fn carried(in_dictionary: Option<Decision>, in_part: Option<Decision>) -> Option<Decision> {
    match (in_dictionary, in_part) {
        (Some(Decision::Commit), _) | (_, Some(Decision::Commit)) => Some(Decision::Commit),
        (_, Some(Decision::Abort)) => Some(Decision::Abort),
        _ => None,
    }
}

/// One pass of recovery; the number of prepared branches it left
/// unresolved (their owner is running, or a backend did not answer).
pub async fn recover(shared: &Cluster, connections: &mut Connections) -> Result<u64, ProxyError> {
    // A connection that failed is not used again, nor one to a writer the
    // backend no longer has.
    let mut dictionary = match connections.dictionary.take() {
        Some(conn) if shared.pools[shared.main].is_current(&conn) => conn,
        _ => crate::dictionary::own_connection(shared, shared.main).await?,
    };
    let mut backends = std::mem::take(&mut connections.backends);
    let (branches, mut left) = prepared_everywhere(shared, connections, &mut backends).await?;
    let alive = alive_instances(shared, &mut dictionary).await?;
    // Until then a stale heartbeat may be the dictionary's absence.
    let stale_means_dead = shared.dictionary.fresh_for(shared.dictionary.lease);
    let gtrids: HashSet<String> = branches
        .iter()
        .flat_map(|(_, xids)| xids.iter().map(Xid::gtrid))
        .collect();
    let gtrid_list: Vec<&str> = gtrids.iter().map(String::as_str).collect();
    let decisions = read_decisions(shared, &mut dictionary, &gtrid_list).await?;
    let in_parts = decisions_in_parts(shared, &branches, &mut backends).await;
    let mut pass = Pass {
        shared,
        dictionary,
        backends,
        decisions,
        in_parts,
        alive,
        stale_means_dead,
    };
    for (slot, xids) in &branches {
        for xid in xids {
            if !pass.resolve_branch(*slot, xid).await? {
                left += 1;
            }
        }
    }
    let Pass {
        mut dictionary,
        mut backends,
        ..
    } = pass;
    if left == 0 {
        forget_old_decisions(shared, &mut dictionary, &gtrids).await?;
        for (&slot, conn) in backends.iter_mut() {
            if slot != shared.main {
                forget_old_decisions(shared, conn, &gtrids).await?;
            }
        }
    }
    connections.dictionary = Some(dictionary);
    connections.backends = backends;
    Ok(left)
}

/// hscale's prepared branches on every backend it reaches, by slot, with
/// recovery's connection to each (the decisions table made where a plain
/// part may write its decision); and how many backends it could not reach.
async fn prepared_everywhere(
    shared: &Cluster,
    connections: &mut Connections,
    backends: &mut HashMap<usize, Box<BackendConn>>,
) -> Result<(Vec<(usize, Vec<Xid>)>, u64), ProxyError> {
    let mut branches: Vec<(usize, Vec<Xid>)> = Vec::new();
    let mut unreached = 0u64;
    for slot in 0..shared.pools.len() {
        // One to a writer the backend no longer has would see its
        // branches, which are the new writer's to resolve.
        let conn = match backends.remove(&slot) {
            Some(conn) if shared.pools[slot].is_current(&conn) => Ok(conn),
            _ => crate::dictionary::own_connection(shared, slot).await,
        };
        let conn = match conn {
            // A plain part's commit writes its decision there.
            Ok(mut conn) if slot != shared.main && !connections.tables_made.contains(&slot) => {
                let schema = &shared.dictionary.schema;
                let made = async {
                    exec(
                        &mut conn,
                        &format!("CREATE DATABASE IF NOT EXISTS {}", ident(schema)),
                    )
                    .await?;
                    exec(&mut conn, &decisions_ddl(schema)).await?;
                    exec(&mut conn, &decisions_proof_ddl(schema)).await
                };
                match made.await {
                    Ok(_) => {
                        connections.tables_made.insert(slot);
                        Ok(conn)
                    }
                    Err(e) => Err(e),
                }
            }
            conn => conn,
        };
        match conn {
            Ok(mut conn) => {
                branches.push((slot, prepared_branches(&mut conn).await?));
                backends.insert(slot, conn);
            }
            Err(e) => {
                tracing::warn!(
                    backend = shared.pools[slot].id(),
                    "two-phase commit recovery cannot reach the backend: {e}"
                );
                unreached += 1;
            }
        }
    }
    Ok((branches, unreached))
}

/// Decisions plain parts carried, by their backend: read where the
/// branches name one other than the dictionary's. A backend missing here
/// could not be read now.
async fn decisions_in_parts(
    shared: &Cluster,
    branches: &[(usize, Vec<Xid>)],
    backends: &mut HashMap<usize, Box<BackendConn>>,
) -> HashMap<u32, HashMap<String, Decision>> {
    let main_id = shared.pools[shared.main].id();
    let elsewhere = |xid: &Xid| xid.decided_on.filter(|&on| on != main_id);
    let mut in_parts: HashMap<u32, HashMap<String, Decision>> = HashMap::new();
    for (_, xids) in branches {
        for xid in xids {
            let Some(on) = elsewhere(xid) else { continue };
            if in_parts.contains_key(&on) {
                continue;
            }
            let conn = shared
                .pool_index(on)
                .and_then(|slot| backends.get_mut(&slot));
            let Some(conn) = conn else { continue };
            let gtrids: Vec<String> = branches
                .iter()
                .flat_map(|(_, xids)| xids.iter())
                .filter(|x| elsewhere(x) == Some(on))
                .map(Xid::gtrid)
                .collect();
            let gtrids: Vec<&str> = gtrids.iter().map(String::as_str).collect();
            match read_decisions(shared, conn, &gtrids).await {
                Ok(found) => {
                    in_parts.insert(on, found);
                }
                Err(e) => tracing::warn!(
                    backend = on,
                    "two-phase commit recovery cannot read the decisions there: {e}"
                ),
            }
        }
    }
    in_parts
}

/// What one pass of recovery knows: its connections, the decisions read,
/// the instances alive.
struct Pass<'a> {
    shared: &'a Cluster,
    dictionary: Box<BackendConn>,
    backends: HashMap<usize, Box<BackendConn>>,
    /// In the dictionary, by gtrid.
    decisions: HashMap<String, Decision>,
    /// Where plain parts carried them (`decisions_in_parts`).
    in_parts: HashMap<u32, HashMap<String, Decision>>,
    alive: HashSet<String>,
    stale_means_dead: bool,
}

impl Pass<'_> {
    /// The branch's decision where it may be; `None` outside: where its
    /// plain part carried it cannot be read now.
    fn decision_of(&self, xid: &Xid, gtrid: &str) -> Option<Option<Decision>> {
        let in_dictionary = self.decisions.get(gtrid).copied();
        match self.decided_elsewhere(xid) {
            None => Some(in_dictionary),
            Some(on) => {
                let found = self.in_parts.get(&on)?;
                Some(carried(in_dictionary, found.get(gtrid).copied()))
            }
        }
    }

    /// The backend of the branch's plain part, where it is not the
    /// dictionary's.
    fn decided_elsewhere(&self, xid: &Xid) -> Option<u32> {
        let main_id = self.shared.pools[self.shared.main].id();
        xid.decided_on.filter(|&on| on != main_id)
    }

    /// Commits or rolls back a prepared branch on `slot` as its
    /// transaction's decision says, deciding an abort where no owner can
    /// finish it; false if it is left prepared (its owner runs, or what
    /// decides it cannot be read or written now).
    async fn resolve_branch(&mut self, slot: usize, xid: &Xid) -> Result<bool, ProxyError> {
        let shared = self.shared;
        let instance = &shared.dictionary.instance;
        let in_flight =
            xid.instance == *instance && lock(&shared.xa.in_flight).contains(&xid.sequence);
        let gtrid = xid.gtrid();
        let Some(decision) = self.decision_of(xid, &gtrid) else {
            return Ok(false);
        };
        let found = Found {
            in_flight,
            owner_alive: xid.instance != *instance
                && (self.alive.contains(&xid.instance) || !self.stale_means_dead),
            decision,
        };
        let mut resolution = resolve(found);
        if let (Resolution::Abort, Some(on)) = (resolution, self.decided_elsewhere(xid)) {
            match self.fence_plain_part(xid, &gtrid, on).await {
                Some(fenced) => resolution = fenced,
                None => return Ok(false),
            }
        }
        if resolution == Resolution::Abort {
            resolution = match insert_decision(
                shared,
                &mut self.dictionary,
                &gtrid,
                Decision::Abort,
            )
            .await
            {
                Recorded::Durable => {
                    self.decisions.insert(gtrid, Decision::Abort);
                    Resolution::Rollback
                }
                Recorded::Preempted(decision) => {
                    self.decisions.insert(gtrid, decision);
                    resolve(Found {
                        decision: Some(decision),
                        ..found
                    })
                }
                Recorded::Refused(e) | Recorded::Unknown(e) => return Err(e),
            };
        }
        let sql = match resolution {
            Resolution::Leave => return Ok(false),
            Resolution::Commit => statements::commit(xid),
            Resolution::Rollback => statements::rollback(xid, true).remove(0),
            Resolution::Abort => unreachable!("decided above"),
        };
        let conn = self.backends.get_mut(&slot).expect("listed on it");
        match run_branch_statement(conn, &sql).await {
            Ok(()) => {
                tracing::info!(branch = %xid, "two-phase commit recovery: {sql}");
                shared.xa.recovered.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(e) => {
                tracing::warn!(branch = %xid, "two-phase commit recovery could not resolve a branch: {e}");
                Ok(false)
            }
        }
    }

    /// An abort recorded where the branch's plain part would write its
    /// commit first, so that a slow owner's commit finds it there and
    /// fails: the resolution that stands (an abort, or the commit that was
    /// there first), or `None` if it could not be recorded.
    async fn fence_plain_part(&mut self, xid: &Xid, gtrid: &str, on: u32) -> Option<Resolution> {
        let shared = self.shared;
        let conn = shared
            .pool_index(on)
            .and_then(|slot| self.backends.get_mut(&slot));
        let recorded = match conn {
            Some(conn) => insert_decision(shared, conn, gtrid, Decision::Abort).await,
            None => Recorded::Unknown(ProxyError::UnknownBackend { backend: on }),
        };
        let resolution = match recorded {
            Recorded::Durable | Recorded::Preempted(Decision::Abort) => Resolution::Abort,
            Recorded::Preempted(Decision::Commit) => Resolution::Commit,
            Recorded::Refused(e) | Recorded::Unknown(e) => {
                tracing::warn!(branch = %xid, "two-phase commit recovery cannot record an abort where the plain part is: {e}");
                return None;
            }
        };
        if let Some(found) = self.in_parts.get_mut(&on) {
            let decision = match resolution {
                Resolution::Commit => Decision::Commit,
                _ => Decision::Abort,
            };
            found.insert(gtrid.to_string(), decision);
        }
        Some(resolution)
    }
}

/// hscale's prepared branches on a backend.
async fn prepared_branches(conn: &mut BackendConn) -> Result<Vec<Xid>, ProxyError> {
    let rows = exec(conn, "XA RECOVER").await?;
    Ok((0..rows.len())
        .filter_map(|row| {
            let number = |column| text(&rows, row, column).parse::<u32>().ok();
            let data = rows.get(row)?.get(3)?.as_deref()?;
            let length = |column| number(column).map(|n| n as usize);
            Xid::recovered(number(0)?, length(1)?, length(2)?, data)
        })
        .collect())
}

/// The instances whose lease is current.
async fn alive_instances(
    shared: &Cluster,
    conn: &mut BackendConn,
) -> Result<HashSet<String>, ProxyError> {
    let lease = shared.dictionary.lease.as_micros();
    let rows = exec(
        conn,
        &format!(
            "SELECT id FROM {}.instances WHERE seen > NOW(6) - INTERVAL {lease} MICROSECOND",
            ident(&shared.dictionary.schema)
        ),
    )
    .await?;
    Ok((0..rows.len()).map(|row| text(&rows, row, 0)).collect())
}

/// Decisions no prepared branch needs any more: commits once every branch
/// committed, aborts once no owner could still try to commit.
async fn forget_old_decisions(
    shared: &Cluster,
    conn: &mut BackendConn,
    prepared: &HashSet<String>,
) -> Result<(), ProxyError> {
    // Read committed, and a range of `decided`: the delete locks only the
    // rows it deletes, not every row and gap, which would hold up the
    // decisions being written (a transaction's plain part writes its own
    // while it holds its row locks).
    exec(
        conn,
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    )
    .await?;
    let keep: Vec<String> = prepared.iter().map(|g| format!("'{g}'")).collect();
    let keep = match keep.is_empty() {
        true => String::new(),
        false => format!(" AND gtrid NOT IN ({})", keep.join(", ")),
    };
    exec(
        conn,
        &format!(
            "DELETE FROM {} WHERE decided < NOW(6) - INTERVAL {} SECOND AND (decision = 'commit' OR decided < NOW(6) - INTERVAL {} SECOND){keep}",
            decisions_table(shared),
            COMMIT_RETENTION.as_secs(),
            ABORT_RETENTION.as_secs()
        ),
    )
    .await?;
    Ok(())
}

//! Two-phase commit's I/O (the protocol is `hscale_transaction`'s): this
//! instance's branch ids and the transactions it is running, the decision
//! rows in the dictionary (`xa_decisions`), and recovery (`recovery`), which
//! every instance runs at start and then periodically: `XA RECOVER` on each
//! backend, and each prepared branch that no running instance is finishing
//! committed or rolled back as its transaction's decision says.

mod recovery;

pub use recovery::{recover, recovery_loop, Connections};

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hscale_transaction::{Decision, Xid};
use hscale_wire::packets::ErrorPacket;

use crate::backend::accounts::AccountId;
use crate::backend::{BackendConn, Bucket, ConnKey};
use crate::dictionary::store::{exec, ident, text};
use crate::error::ProxyError;
use crate::shared::Cluster;

pub const ER_DUP_ENTRY: u16 = 1062;
const ER_NO_SUCH_TABLE: u16 = 1146;
/// XAER_NOTA: the server knows no such branch (resolved already).
const ER_XAER_NOTA: u16 = 1397;

/// How long an abort decision is kept: an owner that was stopped for
/// longer than this and then tries to commit finds its branches gone.
const ABORT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// A commit decision whose branches are all committed goes after this.
const COMMIT_RETENTION: Duration = Duration::from_secs(60);

/// This instance's side of two-phase commit.
#[derive(Default)]
pub struct Coordinator {
    sequence: AtomicU64,
    /// Transactions between their first XA START and their end here:
    /// recovery leaves their branches alone.
    in_flight: Mutex<BTreeSet<u64>>,
    /// Prepared branches the last recovery pass could not resolve.
    pub unresolved: AtomicU64,
    /// Transactions committed in two phases, and rolled back by recovery.
    pub committed: AtomicU64,
    pub recovered: AtomicU64,
    /// Whether each client account may write decisions on each backend
    /// (by account and slot), once asked (`may_record`).
    recordable: Mutex<HashMap<(AccountId, usize), bool>>,
    /// The key of the decisions' proofs, read when the dictionary opens.
    key: std::sync::OnceLock<DecisionKey>,
}

/// The key hscale proves its decision rows with. A plain part's commit
/// writes its decision with the client's account, which may therefore
/// insert rows into `xa_decisions`; recovery believes a row only if it
/// carries an HMAC-SHA256 of the transaction's id and decision under this
/// key, which lives in the dictionary (`xa_key`), where only hscale's own
/// account reads (docs/security.md).
pub struct DecisionKey([u8; 32]);

impl DecisionKey {
    pub fn new(key: [u8; 32]) -> DecisionKey {
        DecisionKey(key)
    }

    /// A new random key, in hex, for the first instance to store.
    pub fn fresh_hex() -> String {
        hex(&rand::random::<[u8; 32]>())
    }

    /// The proof of `decision` for the transaction `gtrid`, in hex.
    pub fn proof(&self, gtrid: &str, decision: Decision) -> String {
        use hmac::Mac;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(gtrid.as_bytes());
        mac.update(b"|");
        mac.update(decision.as_str().as_bytes());
        hex(&mac.finalize().into_bytes())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads the key of the decisions' proofs (`ensure_schema` made it).
pub async fn load_key(shared: &Cluster, conn: &mut BackendConn) -> Result<(), ProxyError> {
    let rows = exec(
        conn,
        &format!(
            "SELECT secret FROM {}.xa_key WHERE id = 1",
            ident(&shared.dictionary.schema)
        ),
    )
    .await?;
    let secret = rows.first().and_then(|row| row.first().cloned().flatten());
    let key = secret
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .ok_or_else(|| ProxyError::DictionaryCorrupt {
            table: hscale_planner::TableName {
                db: shared.dictionary.schema.clone(),
                name: "xa_key".into(),
            },
            what: "it holds no key of 32 bytes".into(),
        })?;
    let _ = shared.xa.key.set(DecisionKey::new(key));
    Ok(())
}

/// The key the dictionary would give, for the session's unit tests,
/// which have no dictionary to open.
#[cfg(test)]
pub(crate) fn use_key_for_test(shared: &Cluster, key: [u8; 32]) {
    let _ = shared.xa.key.set(DecisionKey::new(key));
}

fn key(shared: &Cluster) -> &DecisionKey {
    shared
        .xa
        .key
        .get()
        .expect("the dictionary opens before any transaction or recovery")
}

/// A transaction over several backends, running on this instance; its
/// branches are left to recovery once it is dropped.
pub struct Running {
    shared: Arc<Cluster>,
    pub sequence: u64,
    /// The backend of the transaction's plain part, whose commit may carry
    /// the decision.
    decided_on: Option<u32>,
}

/// Numbers a new transaction over several backends on this instance;
/// `decided_on`: the backend of its plain part, if it has one.
pub fn begin(shared: &Arc<Cluster>, decided_on: Option<u32>) -> Running {
    let sequence = shared.xa.sequence.fetch_add(1, Ordering::Relaxed) + 1;
    lock(&shared.xa.in_flight).insert(sequence);
    Running {
        shared: Arc::clone(shared),
        sequence,
        decided_on,
    }
}

impl Running {
    pub fn instance(&self) -> &str {
        &self.shared.dictionary.instance
    }

    pub fn xid(&self, backend: u32) -> Xid {
        Xid {
            instance: self.instance().to_string(),
            sequence: self.sequence,
            decided_on: self.decided_on,
            backend,
        }
    }

    pub fn gtrid(&self) -> String {
        self.xid(0).gtrid()
    }
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Running({})", self.gtrid())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        lock(&self.shared.xa.in_flight).remove(&self.sequence);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the connections in `bucket` (a client account's) may write
/// decisions on `slot`'s backend: there a transaction's plain part may
/// carry its decision. Asked once per account and backend, by an INSERT
/// that inserts nothing; a backend that cannot be asked now is asked again
/// next time.
pub async fn may_record(shared: &Cluster, slot: usize, bucket: &Bucket) -> bool {
    let key = (bucket.key.account, slot);
    if let Some(&known) = lock(&shared.xa.recordable).get(&key) {
        return known;
    }
    let pool = &shared.pools[slot];
    let Ok(mut lease) = pool.acquire(bucket, None).await else {
        return false;
    };
    let probe = format!(
        "INSERT INTO {} (gtrid, decision, decided) SELECT 'probe', 'abort', NOW(6) FROM DUAL WHERE FALSE",
        decisions_table(shared)
    );
    let recordable = match exec(&mut lease.conn, &probe).await {
        Ok(_) => true,
        // Recovery makes the table on its first pass: asked again later.
        Err(ProxyError::Refused(e)) if e.code == ER_NO_SUCH_TABLE => {
            pool.release_to(bucket, lease.conn);
            return false;
        }
        Err(ProxyError::Refused(e)) => {
            tracing::info!(
                backend = pool.id(),
                "a client account cannot write two-phase commit decisions here ({}): its transactions' parts there are XA branches",
                e.message
            );
            false
        }
        Err(_) => return false,
    };
    // It ran nothing the next client could see.
    pool.release_to(bucket, lease.conn);
    lock(&shared.xa.recordable).insert(key, recordable);
    recordable
}

/// The INSERT of a transaction's commit decision that its plain part runs
/// just before its COMMIT (`session::atomic`): the decision is durable
/// exactly when that part commits.
pub fn decision_insert(shared: &Cluster, gtrid: &str) -> String {
    format!(
        "INSERT INTO {} (gtrid, decision, decided, proof) VALUES ('{gtrid}', '{}', NOW(6), '{}')",
        decisions_table(shared),
        Decision::Commit.as_str(),
        key(shared).proof(gtrid, Decision::Commit)
    )
}

/// What recording a decision came to.
pub enum Recorded {
    /// It is durable.
    Durable,
    /// Another decision was there first (recovery's abort).
    Preempted(Decision),
    /// The dictionary refused it: nothing was recorded.
    Refused(ProxyError),
    /// The connection was lost before the answer: the row may or may not
    /// be there; recovery will read it.
    Unknown(ProxyError),
}

/// Records a transaction's decision in the dictionary, on a service
/// connection of the main backend's pool.
pub async fn record(shared: &Cluster, gtrid: &str, decision: Decision) -> Recorded {
    let pool = &shared.pools[shared.main];
    let bucket = pool.bucket(ConnKey::service());
    let mut lease = match pool.acquire(&bucket, None).await {
        Ok(lease) => lease,
        Err(e) => return Recorded::Refused(ProxyError::Backend(e)),
    };
    let outcome = insert_decision(shared, &mut lease.conn, gtrid, decision).await;
    if !matches!(outcome, Recorded::Unknown(_)) {
        pool.release_to(&bucket, lease.conn);
    }
    outcome
}

async fn insert_decision(
    shared: &Cluster,
    conn: &mut BackendConn,
    gtrid: &str,
    decision: Decision,
) -> Recorded {
    let table = decisions_table(shared);
    let key = key(shared);
    let insert = format!(
        "INSERT INTO {table} (gtrid, decision, decided, proof) VALUES ('{gtrid}', '{}', NOW(6), '{}')",
        decision.as_str(),
        key.proof(gtrid, decision)
    );
    let mut forged_removed = false;
    loop {
        match exec(conn, &insert).await {
            Ok(_) => return Recorded::Durable,
            Err(ProxyError::Refused(e)) if e.code == ER_DUP_ENTRY => {
                match read_decisions(shared, conn, &[gtrid]).await {
                    Ok(found) => match found.get(gtrid) {
                        Some(&earlier) => return Recorded::Preempted(earlier),
                        // A row hscale did not write (it lacks the proof of
                        // either decision) holds the place: removed, once.
                        None if !forged_removed => {
                            let forged = format!(
                                "DELETE FROM {table} WHERE gtrid = '{gtrid}' AND NOT proof <=> '{}' AND NOT proof <=> '{}'",
                                key.proof(gtrid, Decision::Commit),
                                key.proof(gtrid, Decision::Abort)
                            );
                            if let Err(e) = exec(conn, &forged).await {
                                return Recorded::Unknown(e);
                            }
                            forged_removed = true;
                        }
                        None => return Recorded::Refused(ProxyError::Refused(e)),
                    },
                    Err(e) => return Recorded::Unknown(e),
                }
            }
            Err(e @ ProxyError::Refused(_)) => return Recorded::Refused(e),
            Err(e) => return Recorded::Unknown(e),
        }
    }
}

fn decisions_table(shared: &Cluster) -> String {
    format!("{}.xa_decisions", ident(&shared.dictionary.schema))
}

async fn read_decisions(
    shared: &Cluster,
    conn: &mut BackendConn,
    gtrids: &[&str],
) -> Result<HashMap<String, Decision>, ProxyError> {
    if gtrids.is_empty() {
        return Ok(HashMap::new());
    }
    let list: Vec<String> = gtrids.iter().map(|g| format!("'{g}'")).collect();
    let rows = exec(
        conn,
        &format!(
            "SELECT gtrid, decision, proof FROM {} WHERE gtrid IN ({})",
            decisions_table(shared),
            list.join(", ")
        ),
    )
    .await?;
    let key = key(shared);
    // Only hscale's own rows: one the client's account wrote without the
    // key is no decision.
    Ok((0..rows.len())
        .filter_map(|row| {
            let gtrid = text(&rows, row, 0);
            let decision = Decision::parse(&text(&rows, row, 1))?;
            if text(&rows, row, 2) != key.proof(&gtrid, decision) {
                tracing::warn!(
                    gtrid,
                    "a two-phase commit decision without hscale's proof is ignored"
                );
                return None;
            }
            Some((gtrid, decision))
        })
        .collect())
}

/// Runs one of the protocol's statements on a connection; a branch the
/// server no longer knows was resolved already (by recovery, or by the
/// server at a restart): not an error here.
pub async fn run_branch_statement(conn: &mut BackendConn, sql: &str) -> Result<(), ProxyError> {
    match exec(conn, sql).await {
        Ok(_) => Ok(()),
        Err(ProxyError::Refused(e)) if e.code == ER_XAER_NOTA => Ok(()),
        Err(e) => Err(e),
    }
}

/// The error a client gets for a transaction over several backends that
/// recovery rolled back before it could commit (its instance was taken
/// for dead).
pub fn rolled_back_by_recovery() -> ProxyError {
    ProxyError::Refused(ErrorPacket::new(
        1402,
        "XA100",
        "XA_RBROLLBACK: Transaction branch was rolled back: hscale's recovery rolled back this write over several backends before it committed (this instance was taken for dead); nothing of it was written",
    ))
}

/// The error a client gets when the decision's row may or may not have
/// been written: recovery commits or rolls back every branch as it finds.
pub fn outcome_unknown(source: &ProxyError) -> ProxyError {
    ProxyError::Refused(ErrorPacket::new(
        1180,
        "HY000",
        format!("Got error during COMMIT: hscale lost the connection that recorded the commit of a write over several backends ({source}); recovery commits it on every backend or on none"),
    ))
}

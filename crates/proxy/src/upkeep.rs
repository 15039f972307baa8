//! What keeps this instance's view of the cluster current and whole, above
//! the dictionary: at start, the schema made and what a dead instance left
//! half done finished or undone (fenced row copies, schema changes); while
//! it serves, the dictionary polled (faster while a move fences) and the
//! moves whose owner stopped taken over. The dictionary itself calls up
//! into none of this.

use std::sync::Arc;

use crate::backend::BackendConn;
use crate::dictionary::{self, Load, ACKNOWLEDGE_POLL, FENCE_POLL};
use crate::error::ProxyError;
use crate::shared::Shared;

/// Creates the schema if needed, finishes or undoes moves a dead instance
/// left behind, and loads the first snapshot.
pub async fn open(shared: &Shared) -> Result<(), ProxyError> {
    let mut conn = dictionary::own_connection(shared, shared.main).await?;
    let fresh_key = crate::xa::DecisionKey::fresh_hex();
    dictionary::store::ensure_schema(&mut conn, &shared.dictionary.schema, &fresh_key).await?;
    crate::xa::load_key(shared, &mut conn).await?;
    crate::offline::recover(shared, &mut conn).await?;
    crate::admin::schema::recover(shared, &mut conn).await?;
    dictionary::reload_with(shared, &mut conn, Load::Always).await
}

/// Polls the version every `refresh_ms` for as long as the proxy serves,
/// and every `FENCE_POLL` while a move is about to fence or is fencing: the
/// fence waits for every instance to load it, and its clients for every
/// instance to load the switch, so a poll's period is a pause they see.
pub async fn refresh_loop(shared: Arc<Shared>) {
    let mut conn: Option<Box<BackendConn>> = None;
    loop {
        let mut next = shared.dictionary.refresh;
        if conn.is_none() {
            conn = dictionary::impatient_connection(&shared).await;
        }
        if let Some(c) = conn.as_mut() {
            match dictionary::reload_with(&shared, c, Load::WhenChanged).await {
                Ok(()) => {
                    if crate::online::fencing_soon(&shared, c).await
                        || shared
                            .dictionary
                            .switchover_soon
                            .load(std::sync::atomic::Ordering::Relaxed)
                    {
                        next = next.min(FENCE_POLL);
                    }
                    if dictionary::acknowledging(&shared) {
                        next = next.min(ACKNOWLEDGE_POLL);
                    }
                }
                Err(e) => {
                    tracing::warn!("cannot read the dictionary: {e}");
                    conn = None;
                }
            }
        }
        shared.dictionary.check_lease();
        tokio::time::sleep(next).await;
    }
}

/// Takes over moves whose owner stopped and drops retired tables, every
/// `refresh_ms`, apart from the refresh: a claim that waits for a row lock
/// (an instance frozen inside a dictionary transaction holds it until it
/// runs again) must not keep this instance from confirming its lease.
pub async fn sweep_loop(shared: Arc<Shared>) {
    let mut conn: Option<Box<BackendConn>> = None;
    loop {
        if conn.is_none() {
            conn = dictionary::impatient_connection(&shared).await;
        }
        if let Some(c) = conn.as_mut() {
            if !crate::online::sweep(&shared.cluster, c).await {
                conn = None;
            }
        }
        tokio::time::sleep(shared.dictionary.refresh).await;
    }
}

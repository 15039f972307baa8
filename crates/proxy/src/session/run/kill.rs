//! KILL and COM_PROCESS_KILL. Clients know the connection id hscale gave them in
//! the greeting, not the backend's thread id, so hscale translates: it finds the
//! session, kills the backend thread serving it, and for KILL CONNECTION ends the
//! session too. A bare backend thread id is never passed through: it could name
//! another client's connection.

use hscale_planner::{Kill, KillScope};
use hscale_wire::scan::Expect;

use crate::backend::ConnKey;
use crate::error::ProxyError;
use crate::session::client::Client;
use crate::session::Backends;
use crate::shared::Shared;

/// How long KILL waits for the killed session to close its client's socket.
const KILLED_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// KILL from `client`, whose own connections are `backends`'.
pub(in crate::session) async fn run(
    shared: &Shared,
    client: &mut Client,
    backends: &Backends,
    kill: Kill,
) -> Result<(), ProxyError> {
    let own = u64::from(client.connection_id);
    let (scope, id) = match kill {
        Kill::Thread { scope, id } => (scope, id),
        Kill::Own { scope } => (scope, own),
        Kill::Unsupported => {
            return Err(ProxyError::NotSupported {
                what: "KILL USER / KILL QUERY ID",
            })
        }
    };
    if id == own {
        // The statement running on the client's connection is this KILL.
        return Err(match scope {
            KillScope::Query => ProxyError::QueryInterrupted,
            KillScope::Connection => {
                backends.handle.kill();
                ProxyError::ConnectionKilled
            }
        });
    }
    let target = shared
        .sessions
        .get(id)
        .ok_or(ProxyError::NoSuchThread { id })?;
    if !client.admin && target.user() != client.user {
        return Err(ProxyError::KillDenied { id });
    }
    if scope == KillScope::Connection {
        // First: the session then closes without answering the statement
        // its lost backend connection fails, as MariaDB does.
        target.kill();
    }
    for (backend, thread_id) in target.threads() {
        kill_backend_thread(shared, backend, thread_id, scope).await;
    }
    if scope == KillScope::Connection {
        // MariaDB closes the killed connection's socket before KILL
        // answers: a pool that checks its idle connections next sees
        // it closed.
        target.wait_ended(KILLED_CLOSE_WAIT).await;
    }
    Ok(client.send_ok(backends.status_flags()).await?)
}

/// Best effort: the thread may have finished meanwhile, which is fine.
pub(crate) async fn kill_backend_thread(
    shared: &Shared,
    backend: u32,
    thread_id: u32,
    scope: KillScope,
) {
    let Some(pool) = shared.pools.iter().find(|p| p.id() == backend) else {
        return;
    };
    let bucket = pool.bucket(ConnKey::service());
    let Ok(mut lease) = pool.acquire(&bucket, None).await else {
        return;
    };
    let what = if scope == KillScope::Query {
        "QUERY "
    } else {
        ""
    };
    let kill = hscale_wire::command::query(&format!("KILL {what}{thread_id}"));
    match lease.conn.run(&kill, Expect::ResultSets).await {
        Ok(_) => pool.release_to(&bucket, lease.conn),
        Err(e) => tracing::info!(backend, thread_id, "KILL on the backend failed: {e}"),
    }
}

//! Points in hscale's work where a test makes the process die or pause, to
//! check what a crash or a stall at exactly that moment leaves behind:
//! `HSCALE_FAILPOINT=name` kills the process (SIGKILL, as an operator's
//! `kill -9` would) when it reaches `name`; `HSCALE_FAILPOINT=name:ms`
//! pauses there that long. Read once; unset, a point costs one load.

use std::sync::OnceLock;
use std::time::Duration;

fn configured() -> Option<&'static (String, Option<u64>)> {
    static POINT: OnceLock<Option<(String, Option<u64>)>> = OnceLock::new();
    POINT
        .get_or_init(|| {
            let value = std::env::var("HSCALE_FAILPOINT").ok()?;
            Some(match value.split_once(':') {
                Some((name, ms)) => (name.to_string(), ms.parse().ok()),
                None => (value, None),
            })
        })
        .as_ref()
}

pub async fn hit(name: &str) {
    let Some((point, pause)) = configured() else {
        return;
    };
    if point != name {
        return;
    }
    match pause {
        Some(ms) => {
            tracing::warn!("failpoint {name}: pausing {ms} ms");
            tokio::time::sleep(Duration::from_millis(*ms)).await;
        }
        None => {
            tracing::warn!("failpoint {name}: killing the process");
            // SAFETY: kill(2) on this process's own id has no memory effects.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }
}

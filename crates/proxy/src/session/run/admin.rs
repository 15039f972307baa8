//! An HSCALE admin command from a client: only for users with `admin = true`,
//! answered with an OK or a result set that hscale writes itself.

use std::sync::Arc;

use hscale_wire::resultset::text_result;

use crate::admin::{execute, AdminAnswer, Caller};
use crate::error::ProxyError;
use crate::session::client::Client;
use crate::session::messages::Gathered;
use crate::session::slots::Previous;
use crate::session::Backends;
use crate::shared::Shared;

/// Runs the admin command `sql` for `client`, whose statements run on
/// `backends`.
pub(in crate::session) async fn run(
    shared: &Arc<Shared>,
    client: &mut Client,
    backends: &mut Backends,
    sql: &str,
) -> Result<(), ProxyError> {
    if !client.admin {
        return Err(ProxyError::AdminDenied {
            user: client.user.clone(),
        });
    }
    let caller = Caller {
        db: backends.state.db.as_deref(),
        quoting: backends.quoting,
        no_auto_value_on_zero: backends.no_auto_value_on_zero,
    };
    let answer = execute(shared, &caller, sql).await?;
    let status = backends.status_flags();
    let deprecate_eof = client.deprecate_eof();
    // The command's own warnings replace the last statement's, as a
    // server's statement's do: SHOW WARNINGS lists them, or nothing.
    let warnings = match &answer {
        AdminAnswer::Ok { warnings, .. } => warnings.as_slice(),
        AdminAnswer::Rows { .. } => &[],
    };
    backends.gathered = Some(Gathered::own(warnings, deprecate_eof, status));
    backends.previous = Previous::Scattered {
        messages: true,
        slot: shared.main,
    };
    match answer {
        AdminAnswer::Ok {
            affected_rows,
            warnings,
        } => {
            let mut ok = Vec::with_capacity(16);
            hscale_wire::packets::OkInfo {
                affected_rows,
                status,
                warnings: u16::try_from(warnings.len()).unwrap_or(u16::MAX),
                ..Default::default()
            }
            .write(hscale_wire::packets::OK_HEADER, &mut ok);
            client.send_packet(1, &ok).await?;
        }
        AdminAnswer::Rows { columns, rows } => {
            let mut seq = 1;
            for packet in text_result(&columns, &rows, deprecate_eof, status) {
                seq = client.queue_packet(seq, &packet);
            }
            client.flush().await?;
        }
    }
    Ok(())
}

//! An HSCALE admin command from a client: only for users with `admin = true`,
//! answered with an OK or a result set that hscale writes itself.

use hscale_wire::resultset::text_result;

use super::messages::Gathered;
use super::slots::Previous;
use super::Session;
use crate::admin::{execute, AdminAnswer, Caller};
use crate::error::ProxyError;

impl Session {
    pub(super) async fn admin(&mut self, sql: &str) -> Result<(), ProxyError> {
        if !self.client.admin {
            return Err(ProxyError::AdminDenied {
                user: self.client.user.clone(),
            });
        }
        let caller = Caller {
            db: self.backends.state.db.as_deref(),
            quoting: self.backends.quoting,
            no_auto_value_on_zero: self.backends.no_auto_value_on_zero,
        };
        let answer = execute(&self.shared, &caller, sql).await?;
        let status = self.backends.status_flags();
        let deprecate_eof = self.client.deprecate_eof();
        // The command's own warnings replace the last statement's, as a
        // server's statement's do: SHOW WARNINGS lists them, or nothing.
        let warnings = match &answer {
            AdminAnswer::Ok { warnings, .. } => warnings.as_slice(),
            AdminAnswer::Rows { .. } => &[],
        };
        self.backends.gathered = Some(Gathered::own(warnings, deprecate_eof, status));
        self.backends.previous = Previous::Scattered {
            messages: true,
            slot: self.shared.main,
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
                self.client.send_packet(1, &ok).await?;
            }
            AdminAnswer::Rows { columns, rows } => {
                let mut seq = 1;
                for packet in text_result(&columns, &rows, deprecate_eof, status) {
                    seq = self.client.queue_packet(seq, &packet);
                }
                self.client.flush().await?;
            }
        }
        Ok(())
    }
}

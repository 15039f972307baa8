//! The part of a client's session that lives on the server and that hscale
//! replays when it hands the client another backend connection: current
//! database, SET statements, LAST_INSERT_ID().

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use hscale_wire::command;
use hscale_wire::scan::Expect;

use crate::backend::{BackendConn, BackendError};
use crate::error::ProxyError;

/// A connection's settings fingerprint when its session state is not known to
/// be clean: the next client resets it first. Real fingerprints are odd.
pub const UNKNOWN_SETTINGS: u64 = 2;

#[derive(Debug, Default, Clone)]
pub struct SessionState {
    pub db: Option<String>,
    /// SET statements in the order the client ran them, with the variables each sets.
    settings: Vec<(Vec<String>, String)>,
    /// Fingerprint of `settings`; 0 when there are none.
    fingerprint: u64,
    pub last_insert_id: u64,
}

impl SessionState {
    /// Records a SET statement that succeeded; it replaces earlier ones that set
    /// exactly the same variables.
    pub fn record_setting(&mut self, keys: Vec<String>, sql: String) {
        self.settings.retain(|(k, _)| *k != keys);
        self.settings.push((keys, sql));
        let mut hasher = DefaultHasher::new();
        self.settings.hash(&mut hasher);
        self.fingerprint = hasher.finish() | 1;
    }

    pub fn clear_settings(&mut self) {
        self.settings.clear();
        self.fingerprint = 0;
    }

    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Brings `conn` to this state: settings first (a reset would lose the
    /// database), then the database, then LAST_INSERT_ID() when the statement
    /// asks for it.
    ///
    /// A connection the session holds carries what a reset would destroy
    /// (its transaction, temporary tables, variables): it only takes the
    /// SETs, all of them in order, which leaves each variable at its last
    /// value, as a reset and the same SETs would.
    pub async fn apply(
        &self,
        conn: &mut BackendConn,
        wants_last_insert_id: bool,
        held: bool,
    ) -> Result<(), ProxyError> {
        if conn.settings != self.fingerprint {
            if conn.settings != 0 && !held {
                run(conn, &[command::RESET_CONNECTION], Expect::Single).await?;
                conn.statements.clear();
                conn.db = None;
                conn.last_insert_id = 0;
            }
            for (_, sql) in &self.settings {
                run(conn, &command::query(sql), Expect::ResultSets).await?;
            }
            conn.settings = self.fingerprint;
        }
        if let Some(db) = &self.db {
            if conn.db.as_deref() != Some(db.as_str()) {
                run(
                    conn,
                    &command::with_text(command::INIT_DB, db),
                    Expect::Single,
                )
                .await?;
                conn.db = Some(db.clone());
            }
        }
        if wants_last_insert_id && conn.last_insert_id != self.last_insert_id {
            let sql = format!("SELECT LAST_INSERT_ID({})", self.last_insert_id);
            run(conn, &command::query(&sql), Expect::ResultSets).await?;
            conn.last_insert_id = self.last_insert_id;
        }
        Ok(())
    }
}

/// Leaves ROW_COUNT() at 0, what a new connection answers.
pub async fn zero_row_count(conn: &mut BackendConn) -> Result<(), ProxyError> {
    run(conn, &command::query("DO 0"), Expect::ResultSets).await
}

/// Runs a command of the client's own (a deferred BEGIN) for its effect only.
pub async fn run_command(conn: &mut BackendConn, payload: &[u8]) -> Result<(), ProxyError> {
    run(conn, payload, Expect::ResultSets).await
}

async fn run(conn: &mut BackendConn, payload: &[u8], expect: Expect) -> Result<(), ProxyError> {
    match conn.run(payload, expect).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(refused)) => Err(ProxyError::Refused(refused)),
        Err(e) => Err(ProxyError::Backend(e)),
    }
}

/// True when the error left the backend connection unusable.
pub fn breaks_connection(error: &ProxyError) -> bool {
    matches!(
        error,
        ProxyError::Backend(BackendError::Lost { .. } | BackendError::WriterChanged { .. })
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_set_of_the_same_variable_replaces_the_earlier_one() {
        let mut state = SessionState::default();
        state.record_setting(vec!["sql_mode".into()], "SET sql_mode='ANSI'".into());
        state.record_setting(vec!["time_zone".into()], "SET time_zone='+01:00'".into());
        state.record_setting(vec!["sql_mode".into()], "SET sql_mode=''".into());
        let sqls: Vec<&str> = state.settings.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(sqls, ["SET time_zone='+01:00'", "SET sql_mode=''"]);
    }

    #[test]
    fn equal_settings_have_equal_fingerprints_and_none_is_zero() {
        let mut a = SessionState::default();
        let mut b = SessionState::default();
        assert_eq!(a.fingerprint(), 0);
        a.record_setting(vec!["names".into()], "SET NAMES latin1".into());
        b.record_setting(vec!["names".into()], "SET NAMES latin1".into());
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), 0);
        b.record_setting(vec!["autocommit".into()], "SET autocommit=1".into());
        assert_ne!(a.fingerprint(), b.fingerprint());
    }
}

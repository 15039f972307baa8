//! Session state only the server can tell, read back after the statement
//! that changed it: variables a SET with an expression gave, the database a
//! CALL left, the settings a CALL may have changed (`SETTINGS`), recorded as
//! the session's so that every connection it takes later gets them.

use hscale_planner::{client_charset_after, SessionChange};

use super::{Needs, SettingsListed, Unread, Value, Variables};
use crate::backend::BackendConn;
use crate::error::ProxyError;
use crate::session::client::Client;
use crate::session::may_change_session_variables;

/// The session variables that change what a statement answers or does, in
/// MariaDB and MySQL alike: the ones a CALL, which may set any of them out
/// of hscale's sight, is checked for. (Listing every variable from
/// information_schema costs the server a millisecond, 40 times an empty
/// procedure's CALL.)
pub(super) const SETTINGS: [&str; 34] = [
    "auto_increment_increment",
    "auto_increment_offset",
    "character_set_client",
    "character_set_connection",
    "character_set_results",
    "collation_connection",
    "completion_type",
    "default_storage_engine",
    "default_tmp_storage_engine",
    "default_week_format",
    "div_precision_increment",
    "explicit_defaults_for_timestamp",
    "foreign_key_checks",
    "group_concat_max_len",
    "innodb_lock_wait_timeout",
    "lc_messages",
    "lc_time_names",
    "lock_wait_timeout",
    "max_error_count",
    "max_join_size",
    "max_sort_length",
    "sql_auto_is_null",
    "sql_big_selects",
    "sql_buffer_result",
    "sql_mode",
    "sql_notes",
    "sql_quote_show_create",
    "sql_safe_updates",
    "sql_select_limit",
    "sql_warnings",
    "time_zone",
    "unique_checks",
    "updatable_views_with_limit",
    "wait_timeout",
];

/// The values `keys` and, with `database`, DATABASE() have on `conn`:
/// `None` where the server would not say. Keys are read one at a time
/// where reading them together fails (a SET that named an unknown
/// variable failed, but the statements before it ran).
pub(super) async fn read_values(
    conn: &mut BackendConn,
    keys: &[String],
    database: bool,
) -> Option<(Option<Option<String>>, Vec<(String, Value)>)> {
    let plain =
        |k: &String| !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let keys: Vec<&String> = keys.iter().filter(|k| plain(k)).collect();
    let mut columns: Vec<String> = keys.iter().map(|k| format!("@@session.{k}")).collect();
    if database {
        columns.push("DATABASE()".into());
    }
    let row = match conn.query(&format!("SELECT {}", columns.join(", "))).await {
        Ok(Ok(rows)) => rows.into_iter().next()?,
        Ok(Err(_)) => {
            let mut row = Vec::with_capacity(columns.len());
            for column in &columns {
                let one = conn.query(&format!("SELECT {column}")).await.ok()?;
                row.push(
                    one.ok()
                        .and_then(|rows| rows.into_iter().next()?.into_iter().next()?),
                );
            }
            row
        }
        Err(_) => return None,
    };
    let mut values = row.into_iter();
    let settings = keys
        .iter()
        .zip(values.by_ref())
        .map(|(key, value)| (key.to_string(), value))
        .collect();
    let db = database.then(|| {
        values
            .next()
            .flatten()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    });
    Some((db, settings))
}

pub(super) async fn session_variables(conn: &mut BackendConn) -> Option<Variables> {
    let keys = SETTINGS.map(String::from);
    let (_, values) = read_values(conn, &keys, false).await?;
    Some(values.into_iter().collect())
}

/// The settings whose values differ between two listings of one connection.
pub(super) fn changed_settings(before: &Variables, now: &Variables) -> Vec<String> {
    now.iter()
        .filter(|(name, value)| before.get(*name) != Some(value))
        .map(|(name, _)| name.clone())
        .collect()
}

/// `SET @@session.k = v, ...`: what reproduces the values read on another
/// connection. Words stay words and numbers numbers, so that hscale reads
/// a character set back as it reads `SET NAMES`; anything else is written
/// in hex, which reads the same under every sql_mode and character set.
pub(super) fn setting_of(values: &[(String, Value)]) -> String {
    let items = values.iter().map(|(key, value)| {
        let value = match value {
            None => "NULL".to_string(),
            Some(v)
                if !v.is_empty()
                    && v.iter()
                        .all(|b| b.is_ascii_digit() || *b == b'-' || *b == b'.') =>
            {
                String::from_utf8_lossy(v).into_owned()
            }
            Some(v)
                if v.iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b',')) =>
            {
                format!("'{}'", String::from_utf8_lossy(v))
            }
            Some(v) => format!(
                "X'{}'",
                v.iter().map(|b| format!("{b:02x}")).collect::<String>()
            ),
        };
        format!("@@session.{key} = {value}")
    });
    format!("SET {}", items.collect::<Vec<_>>().join(", "))
}

impl crate::session::Backends {
    /// Reads back what `read_back_later` noted and records it as the
    /// session's, so that every other connection takes it.
    pub(in crate::session) async fn read_back(&mut self, client: &mut Client) {
        for Unread {
            slot,
            mut keys,
            database,
            since,
        } in std::mem::take(&mut self.unread)
        {
            // Gone with its connection, which the server ended (or the client reset).
            let Some(mut conn) = self.slots[slot].held.take() else {
                continue;
            };
            let mut values: Vec<(String, Value)> = Vec::new();
            let mut listed = None;
            if let Some(before) = since {
                match session_variables(&mut conn).await {
                    Some(mut now) => {
                        listed = Some(now.clone());
                        for key in changed_settings(&before, &now) {
                            keys.retain(|k| *k != key);
                            let value = now.remove(&key).flatten();
                            values.push((key, value));
                        }
                    }
                    None => tracing::warn!(
                        connection_id = client.connection_id,
                        "could not read session variables; what a CALL set stays on backend {}",
                        conn.backend
                    ),
                }
            }
            if !keys.is_empty() || database {
                match read_values(&mut conn, &keys, database).await {
                    Some((db, read)) => {
                        if let Some(db) = db {
                            conn.key.has_db = db.is_some();
                            conn.db = db.clone();
                            self.set_database(client, db);
                        }
                        values.extend(read);
                    }
                    None => tracing::warn!(
                        connection_id = client.connection_id,
                        "could not read back session state; it stays on backend {}",
                        conn.backend
                    ),
                }
            }
            if !values.is_empty() {
                values.sort_by(|a, b| a.0.cmp(&b.0));
                let keys = values.iter().map(|(key, _)| key.clone()).collect();
                let setting = setting_of(&values);
                self.record(client, SessionChange::Setting(keys, setting), &mut conn);
            }
            if let Some(variables) = listed {
                self.settings_listed = Some(SettingsListed {
                    slot,
                    fingerprint: self.state.fingerprint(),
                    variables,
                });
            }
            self.slots[slot].held = Some(conn);
        }
    }

    /// Records what a successful statement changed, on the session and on the
    /// connection that ran it.
    pub(super) fn record(
        &mut self,
        client: &mut Client,
        change: SessionChange,
        conn: &mut BackendConn,
    ) {
        match change {
            SessionChange::Nothing => {}
            SessionChange::Database(db) => {
                conn.key.has_db = true;
                conn.db = Some(db.clone());
                self.set_database(client, Some(db));
            }
            SessionChange::DroppedDatabase(db) => {
                if conn.db.as_deref() == Some(db.as_str()) {
                    conn.key.has_db = false;
                    conn.db = None;
                }
                if self.state.db.as_deref() == Some(db.as_str()) {
                    self.set_database(client, None);
                }
            }
            SessionChange::ReadBack { .. } => unreachable!("read back later"),
            SessionChange::Setting(keys, sql) => {
                self.session_variables_changed |= may_change_session_variables(sql.as_bytes());
                if keys
                    .iter()
                    .any(|k| k == "names" || k == "character_set_client")
                {
                    client.charset =
                        client_charset_after(&sql, self.quoting).unwrap_or(client.charset);
                }
                self.state.record_setting(keys, sql);
                conn.settings = self.state.fingerprint();
            }
        }
    }

    pub(super) fn read_back_later(&mut self, slot: usize, keys: Vec<String>, database: bool) {
        self.note_unread(slot, keys, database, None);
    }

    /// Before the client's next command, the session variables of `slot`
    /// that differ from `before` become the session's, as a SET would.
    pub(in crate::session) fn read_back_changes_later(&mut self, slot: usize, before: Variables) {
        self.note_unread(slot, Vec::new(), false, Some(before));
    }

    pub(super) fn note_unread(
        &mut self,
        slot: usize,
        keys: Vec<String>,
        database: bool,
        since: Option<Variables>,
    ) {
        // The state is read from this connection: the session keeps it.
        let binding = &mut self.slots[slot].binding;
        binding
            .sticky
            .get_or_insert("session state hscale reads back");
        match self.unread.iter_mut().find(|u| u.slot == slot) {
            Some(unread) => {
                unread.keys.extend(keys);
                unread.keys.sort();
                unread.keys.dedup();
                unread.database |= database;
                // The earliest snapshot: what changed since it all counts.
                unread.since = unread.since.take().or(since);
            }
            None => self.unread.push(Unread {
                slot,
                keys,
                database,
                since,
            }),
        }
    }

    /// Reads `slot`'s session variables, to compare with what a statement
    /// that may set any of them leaves (`read_back_changes_later`). `None`
    /// where the server would not list them.
    pub(in crate::session) async fn session_variables_before(
        &mut self,
        slot: usize,
        needs: Needs,
    ) -> Result<Option<Variables>, ProxyError> {
        let earlier = self
            .unread
            .iter()
            .any(|u| u.slot == slot && u.since.is_some());
        if earlier {
            // An earlier CALL's listing, not yet compared, still stands.
            return Ok(None);
        }
        if let Some(listed) = &self.settings_listed {
            if listed.slot == slot && listed.fingerprint == self.state.fingerprint() {
                return Ok(Some(listed.variables.clone()));
            }
        }
        let mut lease = self.checkout(slot, needs).await?;
        let variables = session_variables(&mut lease.conn).await;
        self.checkin(slot, lease.conn);
        Ok(variables)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_changed_are_those_whose_values_differ() {
        let listing = |pairs: &[(&str, &str)]| -> Variables {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Some(v.as_bytes().to_vec())))
                .collect()
        };
        let before = listing(&[("time_zone", "SYSTEM"), ("sql_mode", "ANSI_QUOTES")]);
        let mut now = listing(&[("time_zone", "+05:00"), ("sql_mode", "ANSI_QUOTES")]);
        assert_eq!(changed_settings(&before, &now), ["time_zone"]);
        now.insert("sql_mode".into(), None);
        let mut changed = changed_settings(&before, &now);
        changed.sort();
        assert_eq!(changed, ["sql_mode", "time_zone"]);
        assert!(changed_settings(&now, &now).is_empty());
    }
}

//! The byte that opens a client's request and names its command (MySQL's
//! `COM_*`), one name each, taken from mysql_common's `Command` so that they
//! match as patterns; and the payload of a command that carries text.

use mysql_common::constants::Command;

pub const QUIT: u8 = Command::COM_QUIT as u8;
pub const INIT_DB: u8 = Command::COM_INIT_DB as u8;
pub const QUERY: u8 = Command::COM_QUERY as u8;
pub const FIELD_LIST: u8 = Command::COM_FIELD_LIST as u8;
pub const STATISTICS: u8 = Command::COM_STATISTICS as u8;
pub const PROCESS_KILL: u8 = Command::COM_PROCESS_KILL as u8;
pub const PING: u8 = Command::COM_PING as u8;
pub const CHANGE_USER: u8 = Command::COM_CHANGE_USER as u8;
pub const BINLOG_DUMP: u8 = Command::COM_BINLOG_DUMP as u8;
pub const STMT_PREPARE: u8 = Command::COM_STMT_PREPARE as u8;
pub const STMT_EXECUTE: u8 = Command::COM_STMT_EXECUTE as u8;
pub const STMT_SEND_LONG_DATA: u8 = Command::COM_STMT_SEND_LONG_DATA as u8;
pub const STMT_CLOSE: u8 = Command::COM_STMT_CLOSE as u8;
pub const STMT_RESET: u8 = Command::COM_STMT_RESET as u8;
pub const SET_OPTION: u8 = Command::COM_SET_OPTION as u8;
pub const STMT_FETCH: u8 = Command::COM_STMT_FETCH as u8;
pub const RESET_CONNECTION: u8 = Command::COM_RESET_CONNECTION as u8;

/// The payload of command `code` whose body is `text`.
pub fn with_text(code: u8, text: &str) -> Vec<u8> {
    let mut payload = Vec::with_capacity(text.len() + 1);
    payload.push(code);
    payload.extend_from_slice(text.as_bytes());
    payload
}

/// The payload of a COM_QUERY of `sql`.
pub fn query(sql: &str) -> Vec<u8> {
    with_text(QUERY, sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bytes_are_the_protocols() {
        let bytes = [
            QUIT,
            INIT_DB,
            QUERY,
            FIELD_LIST,
            STATISTICS,
            PROCESS_KILL,
            PING,
            CHANGE_USER,
            BINLOG_DUMP,
            STMT_PREPARE,
            STMT_EXECUTE,
            STMT_SEND_LONG_DATA,
            STMT_CLOSE,
            STMT_RESET,
            SET_OPTION,
            STMT_FETCH,
            RESET_CONNECTION,
        ];
        let expected = [
            0x01, 0x02, 0x03, 0x04, 0x09, 0x0c, 0x0e, 0x11, 0x12, 0x16, 0x17, 0x18, 0x19, 0x1a,
            0x1b, 0x1c, 0x1f,
        ];
        assert_eq!(bytes, expected);
        assert_eq!(query("DO 1"), b"\x03DO 1");
    }
}

//! Packets hscale writes itself (OK, EOF, ERR, the server greeting) and the few
//! fields it reads from packets it otherwise forwards untouched.

use mysql_common::constants::{CapabilityFlags, StatusFlags};
use mysql_common::io::ParseBuf;
use mysql_common::packets::{HandshakePacket, HandshakeResponse};
use mysql_common::proto::{MyDeserialize, MySerialize};

use crate::frame::{read_lenenc, write_lenenc};
use crate::WireError;

pub const OK_HEADER: u8 = 0x00;
pub const EOF_HEADER: u8 = 0xfe;
pub const ERR_HEADER: u8 = 0xff;
pub const LOCAL_INFILE_HEADER: u8 = 0xfb;

/// An error as it travels to a client: code, SQLSTATE, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorPacket {
    pub code: u16,
    pub sqlstate: [u8; 5],
    pub message: String,
}

impl ErrorPacket {
    pub fn new(code: u16, sqlstate: &str, message: impl Into<String>) -> ErrorPacket {
        let mut state = [b'H'; 5];
        state.copy_from_slice(&sqlstate.as_bytes()[..5]);
        ErrorPacket {
            code,
            sqlstate: state,
            message: message.into(),
        }
    }

    pub fn write(&self, dst: &mut Vec<u8>) {
        dst.push(ERR_HEADER);
        dst.extend_from_slice(&self.code.to_le_bytes());
        dst.push(b'#');
        dst.extend_from_slice(&self.sqlstate);
        dst.extend_from_slice(self.message.as_bytes());
    }

    /// Reads an ERR payload (protocol 4.1 form, with SQLSTATE).
    pub fn parse(payload: &[u8]) -> Result<ErrorPacket, WireError> {
        let malformed = WireError::Malformed { what: "ERR" };
        if payload.len() < 3 || payload[0] != ERR_HEADER {
            return Err(malformed);
        }
        let code = u16::from_le_bytes([payload[1], payload[2]]);
        let rest = &payload[3..];
        let (sqlstate, message) = match rest.first() {
            Some(b'#') if rest.len() >= 6 => {
                let mut state = [0u8; 5];
                state.copy_from_slice(&rest[1..6]);
                (state, &rest[6..])
            }
            _ => (*b"HY000", rest),
        };
        Ok(ErrorPacket {
            code,
            sqlstate,
            message: String::from_utf8_lossy(message).into_owned(),
        })
    }
}

/// The fields of an OK packet that hscale acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OkInfo {
    pub affected_rows: u64,
    pub last_insert_id: u64,
    pub status: u16,
    pub warnings: u16,
}

impl OkInfo {
    /// Reads an OK packet, or an OK-form result set terminator (header 0xfe).
    pub fn parse(payload: &[u8]) -> Option<OkInfo> {
        let body = payload.get(1..)?;
        let (affected_rows, a) = read_lenenc(body)?;
        let (last_insert_id, b) = read_lenenc(&body[a..])?;
        let rest = body.get(a + b..a + b + 4)?;
        Some(OkInfo {
            affected_rows,
            last_insert_id,
            status: u16::from_le_bytes([rest[0], rest[1]]),
            warnings: u16::from_le_bytes([rest[2], rest[3]]),
        })
    }

    pub fn write(&self, header: u8, dst: &mut Vec<u8>) {
        dst.push(header);
        write_lenenc(self.affected_rows, dst);
        write_lenenc(self.last_insert_id, dst);
        dst.extend_from_slice(&self.status.to_le_bytes());
        dst.extend_from_slice(&self.warnings.to_le_bytes());
    }
}

/// Status flags of a classic EOF packet (0xfe, warnings, status).
pub fn eof_status(payload: &[u8]) -> Option<u16> {
    let s = payload.get(3..5)?;
    Some(u16::from_le_bytes([s[0], s[1]]))
}

pub fn write_eof(status: u16, warnings: u16, dst: &mut Vec<u8>) {
    dst.push(EOF_HEADER);
    dst.extend_from_slice(&warnings.to_le_bytes());
    dst.extend_from_slice(&status.to_le_bytes());
}

/// The end of a result set: an EOF packet, or an OK packet with header 0xfe when
/// the client asked for CLIENT_DEPRECATE_EOF.
pub fn write_result_end(deprecate_eof: bool, status: u16, dst: &mut Vec<u8>) {
    if deprecate_eof {
        OkInfo {
            status,
            ..OkInfo::default()
        }
        .write(EOF_HEADER, dst);
    } else {
        write_eof(status, 0, dst);
    }
}

/// Everything the greeting announces.
pub struct Greeting<'a> {
    pub server_version: &'a str,
    pub connection_id: u32,
    pub nonce: &'a [u8; 20],
    pub capabilities: CapabilityFlags,
    pub collation: u8,
    pub status: StatusFlags,
    pub auth_plugin: &'a str,
}

impl Greeting<'_> {
    pub fn write(&self, dst: &mut Vec<u8>) {
        let mut first = [0u8; 8];
        first.copy_from_slice(&self.nonce[..8]);
        // The second part carries a trailing NUL, as servers send it.
        let mut second = self.nonce[8..].to_vec();
        second.push(0);
        HandshakePacket::new(
            10,
            self.server_version.as_bytes(),
            self.connection_id,
            first,
            Some(second),
            self.capabilities,
            self.collation,
            self.status,
            Some(self.auth_plugin.as_bytes()),
        )
        .serialize(dst);
    }
}

/// The server's greeting as a backend sends it.
pub struct ServerGreeting {
    pub server_version: String,
    pub capabilities: CapabilityFlags,
    pub nonce: Vec<u8>,
    pub auth_plugin: String,
    pub connection_id: u32,
    /// The status a new session starts with: autocommit, and whether a
    /// backslash escapes in strings (the server's default sql_mode).
    pub status: StatusFlags,
}

impl ServerGreeting {
    pub fn parse(payload: &[u8]) -> Result<ServerGreeting, WireError> {
        // mysql_common reads the auth data length as a signed byte and subtracts
        // from it, which overflows on a length of 128 or more (the real one is 21).
        let malformed = || WireError::Malformed { what: "handshake" };
        // protocol version, server version up to its NUL, then 20 fixed bytes.
        let version_nul = 1 + payload
            .get(1..)
            .and_then(|p| p.iter().position(|&b| b == 0))
            .ok_or_else(malformed)?;
        if payload
            .get(version_nul + 21)
            .is_some_and(|&len| len >= 0x80)
        {
            return Err(malformed());
        }
        let packet =
            HandshakePacket::deserialize((), &mut ParseBuf(payload)).map_err(|_| malformed())?;
        let mut nonce = packet.scramble_1_ref().to_vec();
        if let Some(rest) = packet.scramble_2_ref() {
            let rest = rest.strip_suffix(&[0]).unwrap_or(rest);
            nonce.extend_from_slice(rest);
        }
        Ok(ServerGreeting {
            server_version: String::from_utf8_lossy(packet.server_version_ref()).into_owned(),
            capabilities: packet.capabilities(),
            nonce,
            auth_plugin: packet
                .auth_plugin()
                .map(|p| String::from_utf8_lossy(p.as_bytes()).into_owned())
                .unwrap_or_default(),
            connection_id: packet.connection_id(),
            status: packet.status_flags(),
        })
    }
}

/// What a client says in its handshake response.
#[derive(Debug, Clone)]
pub struct ClientHello {
    pub capabilities: CapabilityFlags,
    pub collation: u8,
    pub user: String,
    pub auth_response: Vec<u8>,
    pub database: Option<String>,
    pub auth_plugin: Option<String>,
}

impl ClientHello {
    pub fn parse(payload: &[u8]) -> Result<ClientHello, WireError> {
        let r = HandshakeResponse::deserialize((), &mut ParseBuf(payload)).map_err(|_| {
            WireError::Malformed {
                what: "handshake response",
            }
        })?;
        Ok(ClientHello {
            capabilities: r.capabilities(),
            collation: r.collation(),
            user: String::from_utf8_lossy(r.user()).into_owned(),
            auth_response: r.scramble_buf().to_vec(),
            database: r
                .db_name()
                .filter(|d| !d.is_empty())
                .map(|d| String::from_utf8_lossy(d).into_owned()),
            auth_plugin: r
                .auth_plugin()
                .map(|p| String::from_utf8_lossy(p.as_bytes()).into_owned()),
        })
    }

    /// True for the 32-byte SSLRequest some clients send before the real response.
    pub fn is_ssl_request(payload: &[u8]) -> bool {
        payload.len() == 32
            && u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]])
                & CapabilityFlags::CLIENT_SSL.bits()
                != 0
    }
}

/// The handshake response hscale sends to a backend.
pub struct BackendHello<'a> {
    pub capabilities: CapabilityFlags,
    pub collation: u8,
    pub user: &'a str,
    pub auth_response: &'a [u8],
    pub database: Option<&'a str>,
    pub auth_plugin: &'a str,
}

impl BackendHello<'_> {
    /// The SSLRequest: the response's fixed head alone, after which both
    /// sides switch to TLS (its capabilities include CLIENT_SSL).
    pub fn write_ssl_request(capabilities: CapabilityFlags, collation: u8, dst: &mut Vec<u8>) {
        dst.extend_from_slice(&capabilities.bits().to_le_bytes());
        dst.extend_from_slice(&(1u32 << 30).to_le_bytes());
        dst.push(collation);
        dst.extend_from_slice(&[0; 23]);
    }

    pub fn write(&self, dst: &mut Vec<u8>) {
        Self::write_ssl_request(self.capabilities, self.collation, dst);
        dst.extend_from_slice(self.user.as_bytes());
        dst.push(0);
        dst.push(self.auth_response.len() as u8);
        dst.extend_from_slice(self.auth_response);
        if let Some(db) = self.database {
            dst.extend_from_slice(db.as_bytes());
            dst.push(0);
        }
        dst.extend_from_slice(self.auth_plugin.as_bytes());
        dst.push(0);
    }
}

/// An AuthSwitchRequest: the plugin to use and its nonce.
pub fn write_auth_switch(plugin: &str, nonce: &[u8], dst: &mut Vec<u8>) {
    dst.push(0xfe);
    dst.extend_from_slice(plugin.as_bytes());
    dst.push(0);
    dst.extend_from_slice(nonce);
    dst.push(0);
}

/// Reads an AuthSwitchRequest payload: plugin name and nonce.
pub fn parse_auth_switch(payload: &[u8]) -> Option<(String, Vec<u8>)> {
    let body = payload.strip_prefix(&[0xfe])?;
    let nul = body.iter().position(|b| *b == 0)?;
    let plugin = String::from_utf8_lossy(&body[..nul]).into_owned();
    let data = &body[nul + 1..];
    let data = data.strip_suffix(&[0]).unwrap_or(data);
    Some((plugin, data.to_vec()))
}

/// A COM_CHANGE_USER request: user, auth answer, database, collation, plugin.
pub struct ChangeUser {
    pub user: String,
    pub auth_response: Vec<u8>,
    pub database: Option<String>,
    pub collation: Option<u16>,
    pub auth_plugin: Option<String>,
}

impl ChangeUser {
    pub fn parse(payload: &[u8]) -> Result<ChangeUser, WireError> {
        let malformed = WireError::Malformed {
            what: "COM_CHANGE_USER",
        };
        let body = payload.get(1..).ok_or(WireError::Malformed {
            what: "COM_CHANGE_USER",
        })?;
        let (user, rest) = split_nul(body).ok_or(WireError::Malformed {
            what: "COM_CHANGE_USER",
        })?;
        let len = usize::from(*rest.first().ok_or(malformed)?);
        let auth = rest.get(1..1 + len).ok_or(WireError::Malformed {
            what: "COM_CHANGE_USER",
        })?;
        let rest = &rest[1 + len..];
        let (database, rest) = split_nul(rest).unwrap_or((rest, &[]));
        let collation = rest.get(..2).map(|c| u16::from_le_bytes([c[0], c[1]]));
        let plugin = rest.get(2..).and_then(split_nul).map(|(p, _)| p);
        Ok(ChangeUser {
            user: String::from_utf8_lossy(user).into_owned(),
            auth_response: auth.to_vec(),
            database: Some(String::from_utf8_lossy(database).into_owned())
                .filter(|d| !d.is_empty()),
            collation,
            auth_plugin: plugin.map(|p| String::from_utf8_lossy(p).into_owned()),
        })
    }
}

fn split_nul(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = buf.iter().position(|b| *b == 0)?;
    Some((&buf[..nul], &buf[nul + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_packet_round_trips() {
        let e = ErrorPacket::new(1146, "42S02", "Table 'db.t' doesn't exist");
        let mut out = Vec::new();
        e.write(&mut out);
        assert_eq!(ErrorPacket::parse(&out).unwrap(), e);
    }

    #[test]
    fn ok_packet_round_trips_with_large_ids() {
        let ok = OkInfo {
            affected_rows: 3,
            last_insert_id: 70_000,
            status: 0x0003,
            warnings: 1,
        };
        let mut out = Vec::new();
        ok.write(OK_HEADER, &mut out);
        assert_eq!(OkInfo::parse(&out), Some(ok));
    }

    #[test]
    fn greeting_is_readable_as_a_server_greeting() {
        let nonce = crate::auth::new_nonce();
        let mut out = Vec::new();
        Greeting {
            server_version: "10.11.0-MariaDB",
            connection_id: 42,
            nonce: &nonce,
            capabilities: CapabilityFlags::CLIENT_PROTOCOL_41
                | CapabilityFlags::CLIENT_SECURE_CONNECTION
                | CapabilityFlags::CLIENT_PLUGIN_AUTH,
            collation: 45,
            status: StatusFlags::SERVER_STATUS_AUTOCOMMIT,
            auth_plugin: "mysql_native_password",
        }
        .write(&mut out);
        let g = ServerGreeting::parse(&out).unwrap();
        assert_eq!(g.nonce, nonce);
        assert_eq!(g.connection_id, 42);
        assert_eq!(g.auth_plugin, "mysql_native_password");
        // A nonsense auth data length (found by fuzzing) is refused, not a panic.
        let auth_data_len = out.iter().position(|&b| b == 0).unwrap() + 21;
        assert_eq!(out[auth_data_len], 21);
        out[auth_data_len] = 0x87;
        assert!(ServerGreeting::parse(&out).is_err());
    }

    #[test]
    fn backend_hello_is_readable_as_a_client_hello() {
        let mut out = Vec::new();
        BackendHello {
            capabilities: CapabilityFlags::CLIENT_PROTOCOL_41
                | CapabilityFlags::CLIENT_SECURE_CONNECTION
                | CapabilityFlags::CLIENT_PLUGIN_AUTH
                | CapabilityFlags::CLIENT_CONNECT_WITH_DB,
            collation: 45,
            user: "root",
            auth_response: &[1, 2, 3],
            database: Some("shop"),
            auth_plugin: "mysql_native_password",
        }
        .write(&mut out);
        let hello = ClientHello::parse(&out).unwrap();
        assert_eq!(hello.user, "root");
        assert_eq!(hello.auth_response, [1, 2, 3]);
        assert_eq!(hello.database.as_deref(), Some("shop"));
        assert_eq!(hello.auth_plugin.as_deref(), Some("mysql_native_password"));
    }

    #[test]
    fn auth_switch_round_trips() {
        let mut out = Vec::new();
        write_auth_switch("mysql_native_password", b"0123456789abcdefghij", &mut out);
        let (plugin, nonce) = parse_auth_switch(&out).unwrap();
        assert_eq!(plugin, "mysql_native_password");
        assert_eq!(nonce, b"0123456789abcdefghij");
    }
}

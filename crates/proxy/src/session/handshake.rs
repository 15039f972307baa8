//! The client's login: greeting, handshake response, mysql_native_password
//! (switching clients that ask for another plugin), the final OK.

use hscale_wire::auth::{new_nonce, NATIVE_PASSWORD, NONCE_LEN};
use hscale_wire::packets::{write_auth_switch, ClientHello, Greeting, OkInfo, OK_HEADER};
use hscale_wire::stream::PacketStream;
use hscale_wire::{CapabilityFlags, WireError};
use tokio::io::{AsyncRead, AsyncWrite};

use super::MAX_LOGIN_PACKET;
use crate::error::ProxyError;
use crate::shared::Shared;
use crate::tls::ClientStream;

/// What hscale offers clients; TLS too where it has a certificate. No
/// compression yet; no session
/// tracking, because backends answer in the client's format byte for byte.
pub const SERVER_CAPABILITIES: CapabilityFlags = CapabilityFlags::CLIENT_LONG_PASSWORD
    .union(CapabilityFlags::CLIENT_FOUND_ROWS)
    .union(CapabilityFlags::CLIENT_LONG_FLAG)
    .union(CapabilityFlags::CLIENT_CONNECT_WITH_DB)
    .union(CapabilityFlags::CLIENT_ODBC)
    .union(CapabilityFlags::CLIENT_LOCAL_FILES)
    .union(CapabilityFlags::CLIENT_IGNORE_SPACE)
    .union(CapabilityFlags::CLIENT_PROTOCOL_41)
    .union(CapabilityFlags::CLIENT_INTERACTIVE)
    .union(CapabilityFlags::CLIENT_TRANSACTIONS)
    .union(CapabilityFlags::CLIENT_SECURE_CONNECTION)
    .union(CapabilityFlags::CLIENT_MULTI_STATEMENTS)
    .union(CapabilityFlags::CLIENT_MULTI_RESULTS)
    .union(CapabilityFlags::CLIENT_PS_MULTI_RESULTS)
    .union(CapabilityFlags::CLIENT_PLUGIN_AUTH)
    .union(CapabilityFlags::CLIENT_CONNECT_ATTRS)
    .union(CapabilityFlags::CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA)
    .union(CapabilityFlags::CLIENT_DEPRECATE_EOF);

/// utf8mb4_general_ci, what MariaDB announces by default.
const DEFAULT_COLLATION: u8 = 45;

/// A client that has logged in.
pub struct Login {
    pub user: String,
    pub capabilities: CapabilityFlags,
    pub collation: u8,
    pub database: Option<String>,
    pub nonce: [u8; NONCE_LEN],
    /// Sequence id for the packet that answers the login.
    pub next_seq: u8,
}

/// The greeting, a switch to TLS if the client asks for it, and the
/// login. The client's stream comes back, switched or not, unless a failed
/// TLS handshake took it.
pub async fn login(
    mut client: PacketStream<ClientStream>,
    shared: &Shared,
    connection_id: u32,
) -> (
    Option<PacketStream<ClientStream>>,
    Result<Login, (ProxyError, u8)>,
) {
    let nonce = new_nonce();
    let mut greeting = Vec::with_capacity(128);
    let offered = match shared.tls {
        Some(_) => SERVER_CAPABILITIES | CapabilityFlags::CLIENT_SSL,
        None => SERVER_CAPABILITIES,
    };
    Greeting {
        server_version: &shared.server_version,
        connection_id,
        nonce: &nonce,
        capabilities: offered,
        collation: DEFAULT_COLLATION,
        status: shared.new_session_status,
        auth_plugin: NATIVE_PASSWORD,
    }
    .write(&mut greeting);
    if let Err(e) = client.send_packet(0, &greeting).await {
        return (Some(client), Err((e.into(), 0)));
    }
    let mut response = match read(&mut client).await {
        Ok(response) => response,
        Err(e) => return (Some(client), Err((e, 0))),
    };
    if ClientHello::is_ssl_request(&response.payload) {
        let Some(acceptor) = &shared.tls else {
            let seq = response.seq.wrapping_add(1);
            return (Some(client), Err((ProxyError::TlsRequired, seq)));
        };
        let (stream, early) = client.into_parts();
        client = match stream.accept(early, acceptor).await {
            Ok(stream) => PacketStream::new(stream, MAX_LOGIN_PACKET),
            Err(e) => return (None, Err((ProxyError::Client(e.into()), 0))),
        };
        response = match read(&mut client).await {
            Ok(response) => response,
            Err(e) => return (Some(client), Err((e, 0))),
        };
    }
    let seq = response.seq.wrapping_add(1);
    if shared.require_tls && !client.get_ref().is_tls() {
        return (Some(client), Err((ProxyError::InsecureTransport, seq)));
    }
    let hello = match ClientHello::parse(&response.payload) {
        Ok(hello) => hello,
        Err(e) => return (Some(client), Err((e.into(), 0))),
    };
    let attempt = Attempt {
        user: &hello.user,
        plugin: hello.auth_plugin.as_deref(),
        answer: hello.auth_response.clone(),
        seq,
    };
    let login = authenticate(&mut client, shared, &nonce, attempt)
        .await
        .map(|seq| Login {
            capabilities: hello.capabilities & SERVER_CAPABILITIES,
            collation: hello.collation,
            database: hello.database,
            user: hello.user,
            nonce,
            next_seq: seq,
        });
    (Some(client), login)
}

/// A client's claim to be `user`: the plugin it used and its answer.
pub struct Attempt<'a> {
    pub user: &'a str,
    pub plugin: Option<&'a str>,
    pub answer: Vec<u8>,
    /// Sequence id of the next packet to the client.
    pub seq: u8,
}

/// Checks a login (or COM_CHANGE_USER) answer against the configured users,
/// first switching clients that used another plugin to mysql_native_password.
/// Returns the sequence id for the packet that answers it.
pub async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut PacketStream<S>,
    shared: &Shared,
    nonce: &[u8; NONCE_LEN],
    attempt: Attempt<'_>,
) -> Result<u8, (ProxyError, u8)> {
    let Attempt {
        user,
        plugin,
        mut answer,
        mut seq,
    } = attempt;
    if plugin.is_some_and(|p| p != NATIVE_PASSWORD) {
        let mut switch = Vec::with_capacity(64);
        write_auth_switch(NATIVE_PASSWORD, nonce, &mut switch);
        client
            .send_packet(seq, &switch)
            .await
            .map_err(|e| (e.into(), 0))?;
        let reply = read(client).await.map_err(|e| (e, 0))?;
        answer = reply.payload.to_vec();
        seq = reply.seq.wrapping_add(1);
    }
    let known = shared.users.get(user);
    if let Some(stage1) = known.and_then(|u| u.password.stage1(nonce, &answer)) {
        // What the user's backend account may need to log in.
        shared.accounts.learn(shared.accounts.of_user(user), stage1);
    }
    if !known.is_some_and(|u| u.password.verify(nonce, &answer)) {
        tracing::info!(user, "login refused");
        let denied = ProxyError::AccessDenied {
            user: user.to_owned(),
            used_password: !answer.is_empty(),
        };
        return Err((denied, seq));
    }
    Ok(seq)
}

async fn read<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut PacketStream<S>,
) -> Result<hscale_wire::stream::Packet, ProxyError> {
    Ok(client.read_packet().await?.ok_or(WireError::Closed)?)
}

/// The OK that completes a login or a COM_CHANGE_USER.
pub fn ok_packet(status: u16) -> Vec<u8> {
    let mut ok = Vec::with_capacity(16);
    OkInfo {
        status,
        ..OkInfo::default()
    }
    .write(OK_HEADER, &mut ok);
    ok
}

//! The client's login: greeting, a switch to TLS if the client asks,
//! handshake response, mysql_native_password or caching_sha2_password
//! (switching clients that ask for another plugin), the final OK.

use hscale_wire::auth::{
    native_stage1, new_nonce, sha2_digest, verify_sha2_scramble, xor_with_nonce, PasswordHash,
    CACHING_SHA2_PASSWORD, NATIVE_PASSWORD, NONCE_LEN, SHA2_FAST_AUTH_SUCCESS,
    SHA2_PERFORM_FULL_AUTHENTICATION, SHA2_REQUEST_PUBLIC_KEY,
};
use hscale_wire::packets::{write_auth_switch, ClientHello, Greeting, OkInfo, OK_HEADER};
use hscale_wire::stream::PacketStream;
use hscale_wire::{CapabilityFlags, WireError};
use tokio::io::{AsyncRead, AsyncWrite};

use super::MAX_LOGIN_PACKET;
use crate::error::ProxyError;
use crate::shared::Shared;
use crate::tls::ClientStream;

/// What hscale offers clients; TLS too where it has a certificate. No
/// compression yet; no session tracking, because backends answer in the
/// client's format byte for byte.
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

/// The first byte of an AuthMoreData packet.
const AUTH_MORE_DATA: u8 = 0x01;

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
        auth_plugin: shared.default_auth.plugin(),
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
        secure: client.get_ref().is_tls(),
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
    /// The client talks over TLS: its password may come in clear.
    pub secure: bool,
}

/// Checks a login (or COM_CHANGE_USER) answer against the configured users,
/// first switching clients that used a plugin hscale does not speak to the
/// configured one. Returns the sequence id for the packet that answers it.
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
        secure,
    } = attempt;
    let configured = shared.default_auth.plugin();
    // Without CLIENT_PLUGIN_AUTH a client answers as mysql_native_password.
    let mut used = plugin.unwrap_or(NATIVE_PASSWORD);
    if used != NATIVE_PASSWORD && used != configured {
        let mut switch = Vec::with_capacity(64);
        write_auth_switch(configured, nonce, &mut switch);
        client
            .send_packet(seq, &switch)
            .await
            .map_err(|e| (e.into(), 0))?;
        let reply = read(client).await.map_err(|e| (e, 0))?;
        answer = reply.payload.to_vec();
        seq = reply.seq.wrapping_add(1);
        used = configured;
    }
    let known = shared.users.get(user);
    let right = match (used, known) {
        // An unknown user goes through the exchange a known one does,
        // against a password no one has, so that the answers do not tell
        // which user names exist.
        (CACHING_SHA2_PASSWORD, known) => {
            let nobody = PasswordHash::DoubleSha1(rand::random());
            let stored = known.map_or(&nobody, |k| &k.password);
            let mut exchange = Exchange { client, seq };
            let right = sha2_login(&mut exchange, shared, nonce, user, stored, &answer, secure)
                .await
                .map_err(|e| (e, exchange.seq))?;
            seq = exchange.seq;
            right && known.is_some()
        }
        (_, None) => false,
        (_, Some(known)) => {
            if let Some(stage1) = known.password.stage1(nonce, &answer) {
                // What the user's backend account may need to log in.
                shared.accounts.learn(shared.accounts.of_user(user), stage1);
            }
            known.password.verify(nonce, &answer)
        }
    };
    if !right {
        tracing::info!(user, "login refused");
        let denied = ProxyError::AccessDenied {
            user: user.to_owned(),
            used_password: !answer.is_empty(),
        };
        return Err((denied, seq));
    }
    Ok(seq)
}

/// The packets of a login after the handshake response, numbered in turn.
struct Exchange<'c, S> {
    client: &'c mut PacketStream<S>,
    /// Sequence id of the next packet to the client.
    seq: u8,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Exchange<'_, S> {
    async fn send(&mut self, payload: &[u8]) -> Result<(), ProxyError> {
        self.client.send_packet(self.seq, payload).await?;
        self.seq = self.seq.wrapping_add(1);
        Ok(())
    }

    async fn receive(&mut self) -> Result<Vec<u8>, ProxyError> {
        let packet = read(self.client).await?;
        self.seq = packet.seq.wrapping_add(1);
        Ok(packet.payload.to_vec())
    }
}

/// caching_sha2_password: a scramble is checked against the digest kept
/// from the user's last full login (fast authentication); without one, or
/// where it does not match, the
/// client sends its password, in clear over TLS, else encrypted with
/// hscale's RSA key, which it may ask for first. A right password's digest
/// is kept, and what the user's backend account needs is learned from it.
async fn sha2_login<S: AsyncRead + AsyncWrite + Unpin>(
    exchange: &mut Exchange<'_, S>,
    shared: &Shared,
    nonce: &[u8],
    user: &str,
    stored: &PasswordHash,
    scramble: &[u8],
    secure: bool,
) -> Result<bool, ProxyError> {
    if scramble.is_empty() {
        return Ok(*stored == PasswordHash::Empty);
    }
    // A scramble that does not match the kept digest goes on to the full
    // exchange, as MySQL does: a wrong password answers alike whether or
    // not the user logged in lately.
    if let Some(digest) = shared.sha2.digest(user) {
        if verify_sha2_scramble(&digest, nonce, scramble) {
            exchange
                .send(&[AUTH_MORE_DATA, SHA2_FAST_AUTH_SUCCESS])
                .await?;
            return Ok(true);
        }
    }
    exchange
        .send(&[AUTH_MORE_DATA, SHA2_PERFORM_FULL_AUTHENTICATION])
        .await?;
    let reply = exchange.receive().await?;
    let password = match secure {
        true => reply,
        false => {
            let key = shared
                .sha2
                .rsa_key()
                .await
                .ok_or(ProxyError::NotSupported {
                    what: "caching_sha2_password without TLS (no RSA key could be made)",
                })?;
            let encrypted = match reply.as_slice() {
                [SHA2_REQUEST_PUBLIC_KEY] => {
                    let mut answer = vec![AUTH_MORE_DATA];
                    answer.extend_from_slice(key.public_pem.as_bytes());
                    exchange.send(&answer).await?;
                    exchange.receive().await?
                }
                _ => reply,
            };
            // A private-key operation takes a millisecond or two: not on
            // the thread that serves other clients.
            let decrypt = move || {
                let padding = rsa::Oaep::new::<sha1::Sha1>();
                key.private.decrypt(padding, &encrypted).ok()
            };
            match tokio::task::spawn_blocking(decrypt).await.ok().flatten() {
                Some(masked) => xor_with_nonce(&masked, nonce),
                None => return Ok(false),
            }
        }
    };
    let password = password.strip_suffix(&[0]).unwrap_or(&password);
    let right = PasswordHash::of(password) == *stored;
    if right {
        shared.sha2.keep_digest(user, sha2_digest(password));
        let account = shared.accounts.of_user(user);
        shared.accounts.learn(account, native_stage1(password));
    }
    Ok(right)
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

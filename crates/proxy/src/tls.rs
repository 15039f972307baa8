//! TLS on both hops, with rustls: clients switch after hscale's greeting
//! (an SSLRequest), and hscale switches towards a backend after its greeting
//! when `[[backends]] tls` says so. This module builds the rustls
//! configurations from the configured PEM files and holds the stream types.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use hscale_wire::packets::BackendHello;
use hscale_wire::stream::PacketStream;
use hscale_wire::CapabilityFlags;

use crate::backend::{BackendError, BackendStream};
use crate::config::BackendTls;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {what}")]
    File { path: String, what: String },
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let failed = |what: String| TlsError::File {
        path: path.display().to_string(),
        what,
    };
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| failed(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(e.to_string()))?;
    match chain.is_empty() {
        true => Err(failed("no certificate in it".into())),
        false => Ok(chain),
    }
}

/// What clients that switch to TLS are answered with.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let chain = certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::File {
        path: key.display().to_string(),
        what: e.to_string(),
    })?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// How hscale talks TLS to a backend: `None` for `tls = "off"`.
pub fn connector(mode: BackendTls, ca: Option<&Path>) -> Result<Option<TlsConnector>, TlsError> {
    let builder =
        ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let config = match (mode, ca) {
        (BackendTls::Off, _) => return Ok(None),
        (BackendTls::Verify, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for certificate in certificates(ca)? {
                roots.add(certificate)?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        (BackendTls::Verify, None) => {
            return Err(TlsError::File {
                path: "tls_ca".into(),
                what: "tls = \"verify\" needs the CA that signed the backend's certificate".into(),
            })
        }
        // Encrypted, but whoever answers at the address is trusted: the
        // handshake's signature is still checked, the certificate is not.
        (BackendTls::On, _) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider())))
            .with_no_client_auth(),
    };
    Ok(Some(TlsConnector::from(Arc::new(config))))
}

/// The name a backend's certificate must have: the host of its address;
/// `localhost` for a unix socket.
pub fn server_name(address: &str) -> Result<ServerName<'static>, TlsError> {
    let host = match address.rsplit_once(':') {
        _ if address.starts_with('/') => "localhost",
        Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']'),
        None => address,
    };
    ServerName::try_from(host.to_string()).map_err(|e| TlsError::File {
        path: address.into(),
        what: format!("no host name or address for TLS: {e}"),
    })
}

#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// How a backend's connections switch to TLS after its greeting.
pub struct ToBackend {
    pub connector: tokio_rustls::TlsConnector,
    /// What the certificate must name (with `tls = "verify"`).
    pub name: rustls_pki_types::ServerName<'static>,
}

impl ToBackend {
    /// Sends the SSLRequest and runs the TLS handshake; the login goes on
    /// over the stream this returns.
    pub(crate) async fn switch(
        &self,
        mut stream: PacketStream<BackendStream>,
        seq: u8,
        capabilities: CapabilityFlags,
        collation: u8,
        backend: u32,
    ) -> Result<PacketStream<BackendStream>, BackendError> {
        let mut request = Vec::with_capacity(32);
        BackendHello::write_ssl_request(capabilities, collation, &mut request);
        stream
            .send_packet(seq, &request)
            .await
            .map_err(|source| BackendError::Lost { backend, source })?;
        let (socket, _) = stream.into_parts();
        let tls = self
            .connector
            .connect(self.name.clone(), socket)
            .await
            .map_err(|e| BackendError::Tls {
                backend,
                reason: e.to_string(),
            })?;
        Ok(PacketStream::new(
            BackendStream::Tls(Box::new(tls)),
            crate::backend::MAX_PACKET,
        ))
    }
}

/// A client's socket, in clear or switched to TLS.
pub enum ClientStream {
    Plain(ClientSocket),
    Tls(Box<tokio_rustls::server::TlsStream<Rewind<ClientSocket>>>),
}

impl ClientStream {
    pub fn new(socket: TcpStream) -> ClientStream {
        ClientStream::Plain(ClientSocket::Registered(socket))
    }

    /// Switches to TLS; `early` holds what the client sent after its
    /// SSLRequest before hscale answered (the start of its TLS handshake).
    pub async fn accept(self, early: BytesMut, acceptor: &TlsAcceptor) -> io::Result<ClientStream> {
        let ClientStream::Plain(socket) = self else {
            return Err(io::Error::other("the connection uses TLS already"));
        };
        let rewound = Rewind {
            early,
            inner: socket,
        };
        Ok(ClientStream::Tls(Box::new(acceptor.accept(rewound).await?)))
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, ClientStream::Tls(_))
    }

    /// The socket under the TLS session, if any.
    fn socket(&mut self) -> &mut ClientSocket {
        match self {
            ClientStream::Plain(socket) => socket,
            ClientStream::Tls(tls) => &mut tls.get_mut().0.inner,
        }
    }

    /// Leaves the calling worker's reactor between two commands, to be
    /// served by another worker (`cores::Balance`): a TLS session's state
    /// goes along untouched.
    pub fn detach(&mut self) -> io::Result<()> {
        self.socket().detach()
    }

    /// Registers a moved socket with the calling worker's reactor.
    pub fn attach(&mut self) -> io::Result<()> {
        self.socket().attach()
    }
}

/// A client's TCP socket, registered with the reactor of the worker serving
/// it, or on its way to another.
pub enum ClientSocket {
    Registered(TcpStream),
    /// Registered with no reactor; reads and writes fail.
    Moving(std::net::TcpStream),
}

impl ClientSocket {
    /// The socket kept open by a duplicate of it: the registered one is
    /// closed with its registration.
    fn detach(&mut self) -> io::Result<()> {
        let ClientSocket::Registered(socket) = self else {
            return Err(io::Error::other("the client socket is moving already"));
        };
        let duplicate = socket.as_fd().try_clone_to_owned()?;
        *self = ClientSocket::Moving(duplicate.into());
        Ok(())
    }

    fn attach(&mut self) -> io::Result<()> {
        let ClientSocket::Moving(socket) = self else {
            return Err(io::Error::other("the client socket is not moving"));
        };
        *self = ClientSocket::Registered(TcpStream::from_std(socket.try_clone()?)?);
        Ok(())
    }

    fn registered(&mut self) -> io::Result<&mut TcpStream> {
        match self {
            ClientSocket::Registered(socket) => Ok(socket),
            ClientSocket::Moving(_) => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the client is moving between workers",
            )),
        }
    }
}

impl AsRawFd for ClientSocket {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            ClientSocket::Registered(s) => s.as_raw_fd(),
            ClientSocket::Moving(s) => s.as_raw_fd(),
        }
    }
}

impl AsRawFd for ClientStream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            ClientStream::Plain(s) => s.as_raw_fd(),
            ClientStream::Tls(s) => s.get_ref().0.inner.as_raw_fd(),
        }
    }
}

impl AsyncRead for ClientSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut().registered() {
            Ok(s) => Pin::new(s).poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for ClientSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().registered() {
            Ok(s) => Pin::new(s).poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().registered() {
            Ok(s) => Pin::new(s).poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().registered() {
            Ok(s) => Pin::new(s).poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

/// A stream that first yields bytes read from it earlier.
pub struct Rewind<S> {
    early: BytesMut,
    pub inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.early.is_empty() {
            let n = self.early.len().min(buf.remaining());
            buf.put_slice(&self.early[..n]);
            self.early.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

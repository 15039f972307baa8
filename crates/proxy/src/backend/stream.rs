//! A backend socket: TCP or a unix socket, behind one type.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

pub enum BackendStream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl BackendStream {
    pub async fn connect(address: &str) -> io::Result<BackendStream> {
        if address.starts_with('/') {
            Ok(BackendStream::Unix(UnixStream::connect(address).await?))
        } else {
            let tcp = TcpStream::connect(address).await?;
            tcp.set_nodelay(true)?;
            Ok(BackendStream::Tcp(tcp))
        }
    }

    /// True when the peer has closed or sent something unasked: the connection
    /// cannot serve a new command. Never blocks.
    pub fn is_stale(&self) -> bool {
        let mut probe = [0u8; 1];
        let result = match self {
            BackendStream::Tcp(s) => s.try_read(&mut probe),
            BackendStream::Unix(s) => s.try_read(&mut probe),
        };
        !matches!(result, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

impl AsyncRead for BackendStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            BackendStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BackendStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            BackendStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            BackendStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            BackendStream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            BackendStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

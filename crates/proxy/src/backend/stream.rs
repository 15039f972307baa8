//! A backend socket: TCP or a unix socket, behind one type.

use std::io::{self, Write};
use std::mem::MaybeUninit;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use socket2::SockRef;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

pub enum BackendStream {
    Tcp(TcpStream),
    Unix(UnixSocket),
    /// Switched to TLS after the server's greeting.
    Tls(Box<tokio_rustls::client::TlsStream<BackendStream>>),
}

impl BackendStream {
    pub async fn connect(address: &str) -> io::Result<BackendStream> {
        if address.starts_with('/') {
            Ok(BackendStream::Unix(UnixSocket::connect(address).await?))
        } else {
            let tcp = TcpStream::connect(address).await?;
            tcp.set_nodelay(true)?;
            Ok(BackendStream::Tcp(tcp))
        }
    }

    /// Registers the socket with the calling worker's reactor instead of
    /// the one that polled it so far (a connection taken from another
    /// worker's idle list): a duplicate of the descriptor is registered, the
    /// old registration closed with the old descriptor. A TLS session's
    /// state goes along. Only between commands, with nothing unread.
    pub fn rehome(&mut self) -> io::Result<()> {
        match self {
            BackendStream::Tcp(socket) => {
                let duplicate = socket.as_fd().try_clone_to_owned()?;
                *socket = TcpStream::from_std(std::net::TcpStream::from(duplicate))?;
            }
            BackendStream::Unix(unix) => {
                let duplicate = unix.socket.get_ref().as_fd().try_clone_to_owned()?;
                let stream = std::os::unix::net::UnixStream::from(duplicate);
                *unix = UnixSocket {
                    socket: register(stream, Interest::READABLE)?,
                    write_space: None,
                };
            }
            BackendStream::Tls(tls) => tls.get_mut().0.rehome()?,
        }
        Ok(())
    }

    /// True when the peer has closed or sent something unasked: the connection
    /// cannot serve a new command. Never blocks. Without `ask_kernel` it costs
    /// nothing unless the reactor saw the socket become readable since hscale
    /// last drained it (a server closing an idle connection makes it so); with
    /// it, the socket itself is read, for a connection idle long enough that
    /// the reactor's word alone is not worth trusting.
    pub fn is_stale(&self, ask_kernel: bool) -> bool {
        let mut probe = [MaybeUninit::<u8>::uninit(); 1];
        let result = match (self, ask_kernel) {
            (BackendStream::Tcp(s), false) => {
                s.try_io(Interest::READABLE, || SockRef::from(s).recv(&mut probe))
            }
            (BackendStream::Tcp(s), true) => SockRef::from(s).recv(&mut probe),
            (BackendStream::Unix(s), false) => s.socket.try_io(Interest::READABLE, |socket| {
                SockRef::from(socket).recv(&mut probe)
            }),
            (BackendStream::Unix(s), true) => SockRef::from(s.socket.get_ref()).recv(&mut probe),
            // TLS reads its socket only when asked: anything the server sent
            // since, a close_notify too, waits there.
            (BackendStream::Tls(s), _) => return s.get_ref().0.is_stale(ask_kernel),
        };
        !matches!(result, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

/// A unix socket registered for readability only. Linux signals write space on a
/// unix socket each time its peer reads from it, so a socket also registered for
/// writability (as tokio's `UnixStream` always is) wakes hscale once more per
/// command, for nothing: three wake-ups per query instead of two at concurrency 1
/// (docs/benchmarks.md). Writes go straight to the socket; only when it is full
/// does hscale wait for write space, on a duplicate descriptor registered for
/// writability for as long as that wait lasts.
pub struct UnixSocket {
    socket: AsyncFd<std::os::unix::net::UnixStream>,
    write_space: Option<AsyncFd<OwnedFd>>,
}

impl UnixSocket {
    async fn connect(path: &str) -> io::Result<UnixSocket> {
        let stream = tokio::net::UnixStream::connect(path).await?.into_std()?;
        Ok(UnixSocket {
            socket: register(stream, Interest::READABLE)?,
            write_space: None,
        })
    }
}

/// Registers a descriptor the value owns (a std socket, an `OwnedFd`) with the
/// runtime's reactor.
fn register<T: AsRawFd>(owner: T, interest: Interest) -> io::Result<AsyncFd<T>> {
    // SAFETY: `owner` owns its descriptor and keeps it open, unchanged, until it
    // is dropped with the `AsyncFd`; nothing here swaps it through `get_mut`.
    Ok(unsafe { AsyncFd::register_with_interest(owner, interest) }?)
}

impl AsyncRead for UnixSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.socket.poll_read_ready(cx))?;
            // SAFETY: `recv` only writes into the slice, and `assume_init` covers
            // exactly the bytes it reports written. Reading into the uninitialised
            // part spares zeroing the 64 KiB read buffer before every read.
            let unfilled: &mut [MaybeUninit<u8>] = unsafe { buf.unfilled_mut() };
            let wanted = unfilled.len();
            match guard.try_io(|socket| SockRef::from(socket.get_ref()).recv(unfilled)) {
                Ok(Ok(n)) => {
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    // A short read drained the socket (epoll is edge-triggered):
                    // wait for the next edge rather than ask again and hear EAGAIN.
                    if n > 0 && n < wanted {
                        guard.clear_ready();
                    }
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for UnixSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            match (&mut this.socket.get_ref()).write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                result => {
                    this.write_space = None;
                    return Poll::Ready(result);
                }
            }
            if this.write_space.is_none() {
                let duplicate = this.socket.get_ref().as_fd().try_clone_to_owned()?;
                this.write_space = Some(register(duplicate, Interest::WRITABLE)?);
            }
            let waiter = this.write_space.as_ref().expect("registered above");
            ready!(waiter.poll_write_ready(cx))?.clear_ready();
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.socket.get_ref().shutdown(Shutdown::Write))
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
            BackendStream::Tls(s) => Pin::new(s).poll_read(cx, buf),
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
            BackendStream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            BackendStream::Unix(s) => Pin::new(s).poll_flush(cx),
            BackendStream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            BackendStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            BackendStream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

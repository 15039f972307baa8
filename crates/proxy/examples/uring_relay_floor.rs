//! The floor without readiness polling: a byte relay on io_uring, one thread,
//! completions for every connection reaped in one system call. `bench/floor.sh`
//! runs it beside the tokio relay (`relay_floor`) to show how much of a proxy's
//! CPU per query is the kernel's price for each recv, send and wake-up, and how
//! much batching those could save. Linux only; not part of hscale.
//!
//!     cargo run --release --example uring_relay_floor -- LISTEN_ADDR BACKEND_UNIX_SOCKET

use std::net::TcpListener;
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::os::unix::net::UnixStream;

use io_uring::{opcode, squeue, types, IoUring};

const BUFFER: usize = 64 * 1024;
const ACCEPT: u64 = u64::MAX;
const SENT: u64 = 1;

/// One direction of a relayed connection: bytes read from `from`, being sent to
/// `to`. Directions come in pairs, 2n client to backend and 2n+1 back.
struct Direction {
    from: RawFd,
    to: RawFd,
    buffer: Vec<u8>,
    filled: usize,
    sent: usize,
    ended: bool,
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(backend)) = (args.next(), args.next()) else {
        eprintln!("usage: uring_relay_floor LISTEN_ADDR BACKEND_UNIX_SOCKET");
        std::process::exit(2);
    };
    let listener = TcpListener::bind(&listen)?;
    let mut ring = IoUring::new(4096)?;
    let mut directions: Vec<Direction> = Vec::new();
    let accept = opcode::Accept::new(
        types::Fd(listener.as_raw_fd()),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    )
    .build()
    .user_data(ACCEPT);
    submit(&mut ring, &accept)?;
    loop {
        ring.submit_and_wait(1)?;
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (data, result) in done {
            if data == ACCEPT {
                if result >= 0 {
                    let client = result;
                    set_nodelay(client);
                    // A blocking connect on the loop: the relay measures queries,
                    // not connection set-up.
                    let server = UnixStream::connect(&backend)?.into_raw_fd();
                    for (from, to) in [(client, server), (server, client)] {
                        directions.push(Direction {
                            from,
                            to,
                            buffer: vec![0; BUFFER],
                            filled: 0,
                            sent: 0,
                            ended: false,
                        });
                        let index = directions.len() - 1;
                        submit(&mut ring, &receive(&mut directions[index], index))?;
                    }
                }
                submit(&mut ring, &accept)?;
                continue;
            }
            let index = (data >> 1) as usize;
            if result <= 0 {
                end(&mut directions, index);
                continue;
            }
            let direction = &mut directions[index];
            if data & SENT == 0 {
                direction.filled = result as usize;
            } else {
                direction.sent += result as usize;
            }
            let next = if direction.sent < direction.filled {
                let pending = &direction.buffer[direction.sent..direction.filled];
                opcode::Send::new(
                    types::Fd(direction.to),
                    pending.as_ptr(),
                    pending.len() as u32,
                )
                .build()
                .user_data((index as u64) << 1 | SENT)
            } else {
                receive(direction, index)
            };
            submit(&mut ring, &next)?;
        }
    }
}

/// One direction hit the end of its stream or an error. Shutting both sockets
/// down completes the other direction's pending receive, so that the pair is
/// closed once both have ended: closing a descriptor alone would not, as the
/// ring holds the socket open while an operation on it is pending.
fn end(directions: &mut [Direction], index: usize) {
    directions[index].ended = true;
    let (from, to) = (directions[index].from, directions[index].to);
    // SAFETY: shutdown and close on descriptors this relay opened; they are
    // closed once, when the second direction of the pair ends.
    unsafe {
        if directions[index ^ 1].ended {
            libc::close(from);
            libc::close(to);
        } else {
            libc::shutdown(from, libc::SHUT_RDWR);
            libc::shutdown(to, libc::SHUT_RDWR);
        }
    }
}

fn receive(direction: &mut Direction, index: usize) -> squeue::Entry {
    direction.filled = 0;
    direction.sent = 0;
    opcode::Recv::new(
        types::Fd(direction.from),
        direction.buffer.as_mut_ptr(),
        BUFFER as u32,
    )
    .build()
    .user_data((index as u64) << 1)
}

fn submit(ring: &mut IoUring, entry: &squeue::Entry) -> std::io::Result<()> {
    // SAFETY: every buffer an entry points into is the heap allocation of a
    // `Direction`'s buffer, which lives as long as the relay and does not move
    // when the vector of directions grows.
    while unsafe { ring.submission().push(entry) }.is_err() {
        ring.submit()?;
    }
    Ok(())
}
fn set_nodelay(fd: RawFd) {
    let on: libc::c_int = 1;
    // SAFETY: a valid socket descriptor and a c_int option value.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

//! The server's end of a worker's stdin: a Unix stream socket that carries
//! requests to the worker and, the other way, a direct session's pipes.
//!
//! The runtime watches it for readability only. A stream socket signals
//! room to write each time its peer reads, so a socket also watched for
//! writability woke a runtime thread for every request the worker read,
//! while the server waited for the worker's answer on another pipe. Frames
//! are written straight away; only a frame larger than the room left in
//! the socket waits, on a duplicate of the socket watched for writability
//! for as long as that takes.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, send};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

#[derive(Debug)]
pub(crate) struct Channel {
    socket: AsyncFd<OwnedFd>,
}

impl Channel {
    /// `socket` must be in non-blocking mode.
    pub(crate) fn new(socket: std::os::unix::net::UnixStream) -> io::Result<Channel> {
        Ok(Channel {
            socket: crate::sys::watch_readable(OwnedFd::from(socket))?,
        })
    }

    /// Write all of `frame`.
    pub(crate) async fn write_all(&self, mut frame: &[u8]) -> io::Result<()> {
        while !frame.is_empty() {
            match send(self.socket.as_raw_fd(), frame, MsgFlags::MSG_NOSIGNAL) {
                Ok(n) => frame = &frame[n..],
                Err(Errno::EAGAIN) => self.room().await?,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Wait until the socket has room to write.
    async fn room(&self) -> io::Result<()> {
        let watched = crate::sys::watch(self.socket.get_ref().try_clone()?, Interest::WRITABLE)?;
        drop(watched.writable().await?);
        Ok(())
    }

    /// Wait until the socket may be read.
    pub(crate) async fn readable(&self) -> io::Result<()> {
        drop(self.socket.readable().await?);
        Ok(())
    }

    /// Run `read` on the socket, and forget that it was readable when
    /// `read` finds nothing to read (`WouldBlock`).
    pub(crate) fn try_read<R>(&self, read: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        self.socket.try_io(Interest::READABLE, |_| read())
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.get_ref().as_fd()
    }
}

//! The few system calls no safe crate wraps. Everything `unsafe` in the
//! crate lives here, one block per call, each with its `SAFETY` note.

#![allow(unsafe_code)]

use nix::libc;

/// Mark every descriptor from 3 up close-on-exec, so that no program this
/// process starts inherits one: the server may itself have been started
/// with descriptors open (a secret file, a pipe of whoever started it),
/// and a worker must see only its protocol pipes. Nothing is closed here,
/// so descriptors this process uses keep working until it `exec`s.
pub(crate) fn cloexec_from_3() -> std::io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC closes nothing; it only
    // sets a flag on descriptors, so no memory or descriptor owned by Rust
    // code becomes invalid. It takes no pointers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    // Kernels before 5.11: one fcntl per open descriptor.
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd >= 3)
        .collect();
    for fd in fds {
        // SAFETY: F_SETFD only sets the close-on-exec flag of a descriptor
        // (or fails with EBADF for one closed meanwhile, such as the
        // directory handle of the listing above); it takes no pointers.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}

/// Clear close-on-exec on `fd`, so that the program this process `exec`s
/// next inherits it (after [`cloexec_from_3`] marked it).
pub(crate) fn inherit_fd(fd: i32) -> std::io::Result<()> {
    // SAFETY: F_SETFD only clears the close-on-exec flag of a descriptor
    // (or fails with EBADF); it takes no pointers and invalidates nothing.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `fork`, for a process that has one thread (the launcher, or the binary
/// before its runtime starts: see `sandbox::probe_early`); refused with
/// `EBUSY` in one with more.
pub(crate) fn fork_single_threaded() -> std::io::Result<nix::unistd::ForkResult> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let threads = status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse::<u32>().ok());
    if threads != Some(1) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::ResourceBusy,
            format!("fork needs a process of one thread, this one has {threads:?}"),
        ));
    }
    // SAFETY: with one thread there is no other thread whose locks (the
    // allocator's, stdio's) the child could inherit held; the child may
    // then allocate and run ordinary Rust code, as the process did before.
    unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)
}

/// Receive one message from the Unix socket `socket` and the descriptors it
/// carries (`SCM_RIGHTS`, at most `max`), without waiting: the caller waits
/// for the socket to be readable. The descriptors arrive close-on-exec.
/// A message that carried more than `max` is an error (those it did carry
/// are closed).
pub(crate) fn recv_fds(
    socket: std::os::fd::BorrowedFd<'_>,
    max: usize,
) -> std::io::Result<Vec<std::os::fd::OwnedFd>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = vec![0u8; nix::sys::socket::cmsg_space::<RawFd>() * max.max(1)];
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )?;
    let mut fds = Vec::new();
    let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
    for cmsg in msg.cmsgs().into_iter().flatten() {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            for fd in raw {
                // SAFETY: the kernel installed `fd` in this process for this
                // message just now; nothing else refers to it, so it is ours
                // to own (and to close when dropped).
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if truncated || fds.len() > max {
        return Err(std::io::Error::other(format!(
            "a message carried more than {max} descriptors"
        )));
    }
    Ok(fds)
}

/// Register `fd` with the tokio reactor for readability: an
/// [`tokio::io::unix::AsyncFd`] that owns it.
pub(crate) fn watch_readable(
    fd: std::os::fd::OwnedFd,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    watch(fd, tokio::io::Interest::READABLE)
}

/// Register `fd` with the tokio reactor for `interest`: an
/// [`tokio::io::unix::AsyncFd`] that owns it.
pub(crate) fn watch(
    fd: std::os::fd::OwnedFd,
    interest: tokio::io::Interest,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: the `AsyncFd` owns `fd`, an `OwnedFd`: it stays open and
    // refers to the same file description until the `AsyncFd` is dropped,
    // and `as_raw_fd` always returns that descriptor.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }
        .map_err(std::io::Error::from)
}

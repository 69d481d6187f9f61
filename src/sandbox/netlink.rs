//! Bringing the loopback interface of a new network namespace up: one
//! `RTM_NEWLINK` request over a route netlink socket (what `ip link set lo up`
//! sends), written by hand so that no netlink stack or `unsafe` ioctl is needed.

use std::os::fd::AsRawFd;

use nix::net::if_::if_nametoindex;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, socket,
};

const RTM_NEWLINK: u16 = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const IFF_UP: u32 = 1;

/// Set `IFF_UP` on `lo` in the caller's network namespace.
pub(super) fn loopback_up() -> Result<(), String> {
    let index = if_nametoindex("lo").map_err(|e| format!("no loopback interface: {e}"))?;
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )
    .map_err(|e| format!("netlink socket: {e}"))?;
    // struct nlmsghdr (16 bytes) + struct ifinfomsg (16 bytes), native endian.
    let mut msg = Vec::with_capacity(32);
    msg.extend_from_slice(&32u32.to_ne_bytes()); // nlmsg_len
    msg.extend_from_slice(&RTM_NEWLINK.to_ne_bytes()); // nlmsg_type
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes()); // nlmsg_flags
    msg.extend_from_slice(&1u32.to_ne_bytes()); // nlmsg_seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid
    msg.push(0); // ifi_family = AF_UNSPEC
    msg.push(0); // padding
    msg.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    msg.extend_from_slice(&(index as i32).to_ne_bytes()); // ifi_index
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_flags
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_change
    sendto(
        fd.as_raw_fd(),
        &msg,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )
    .map_err(|e| format!("netlink send: {e}"))?;
    let mut reply = [0u8; 1024];
    let n = recv(fd.as_raw_fd(), &mut reply, MsgFlags::empty())
        .map_err(|e| format!("netlink receive: {e}"))?;
    if n < 20 {
        return Err("short netlink answer".into());
    }
    let kind = u16::from_ne_bytes([reply[4], reply[5]]);
    if kind != NLMSG_ERROR {
        return Err(format!("unexpected netlink answer type {kind}"));
    }
    let errno = i32::from_ne_bytes([reply[16], reply[17], reply[18], reply[19]]);
    if errno != 0 {
        return Err(format!(
            "netlink: {}",
            nix::errno::Errno::from_raw(-errno).desc()
        ));
    }
    Ok(())
}

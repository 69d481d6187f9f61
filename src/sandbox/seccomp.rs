//! The syscall filter every worker starts under (and every run, its child,
//! inherits): system calls that Python code has no business making and that
//! widen the kernel's attack surface fail with `EPERM`; everything else is
//! allowed. The launcher installs it last, just before it `exec`s the worker,
//! once namespaces, mounts and `no_new_privs` are in place.
//!
//! Built with `seccompiler` for x86_64 and aarch64. On other architectures
//! [`install`] refuses, the server does not ask for the filter, and `/health`
//! reports `"seccomp": false`.

/// Which sockets a worker may create, on top of the calls denied always.
/// `socketpair` stays allowed in every case: it makes a connected pair
/// reachable by nobody else (multiprocessing's pipes, the worker's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SocketFilter {
    /// Any socket (the namespace tier: its network and its mounts hide the
    /// host's sockets).
    #[default]
    None,
    /// No `AF_UNIX` socket: without a mount namespace, a pathname socket of
    /// the host (a container daemon, dbus) would be reachable by path, and
    /// Landlock does not mediate `connect` on those.
    Unix,
    /// No socket of any family: the container tier's isolated network.
    All,
}

impl SocketFilter {
    pub fn as_str(self) -> &'static str {
        match self {
            SocketFilter::None => "none",
            SocketFilter::Unix => "unix",
            SocketFilter::All => "all",
        }
    }
}

/// Install the filter on the calling thread; it survives `exec` and is
/// inherited by every child. Needs `no_new_privs` (or `CAP_SYS_ADMIN`).
pub(crate) fn install(sockets: SocketFilter) -> Result<(), String> {
    imp::install(sockets)
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod imp {
    use std::collections::BTreeMap;

    use nix::libc;

    use super::SocketFilter;
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule,
    };

    /// Denied outright, whatever their arguments.
    const DENIED: &[i64] = &[
        // Reading or steering other processes: their memory, their fds.
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        libc::SYS_process_madvise,
        libc::SYS_kcmp,
        // Mounts: the sandbox's are made before the filter; none after.
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fsconfig,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        // No new namespaces, and no joining others (see `clone` below too).
        libc::SYS_unshare,
        libc::SYS_setns,
        // The kernel itself: new kernels, modules, programs, keys.
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_lookup_dcookie,
        // io_uring: a large, often vulnerable surface that bypasses this filter's view.
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        // The machine: accounting, swap, reboot, kernel log, clocks, quotas, terminals.
        libc::SYS_acct,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_syslog,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_adjtimex,
        libc::SYS_quotactl,
        libc::SYS_quotactl_fd,
        libc::SYS_vhangup,
        libc::SYS_sethostname,
        libc::SYS_setdomainname,
        // Opening files by handle walks around path-based confinement.
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_iopl,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_ioperm,
    ];

    /// `clone` flags that make namespaces. (`CLONE_NEWTIME` shares its bit
    /// with the exit signal in `clone`; only `clone3` and `unshare` take it.)
    const NAMESPACE_FLAGS: &[i32] = &[
        libc::CLONE_NEWNS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
    ];

    /// `personality` arguments left allowed: the default domain, and the query.
    const PERSONALITY_ALLOWED: &[u64] = &[0, 0xffff_ffff];

    /// The x32 ABI's syscall numbers are the x86_64 ones with this bit set
    /// (the same audit architecture), except for a few of its own.
    #[cfg(target_arch = "x86_64")]
    const X32_BIT: i64 = 0x4000_0000;
    /// x32's own numbers for calls denied above.
    #[cfg(target_arch = "x86_64")]
    const X32_ONLY: &[i64] = &[
        521, // ptrace
        528, // kexec_load
        539, // process_vm_readv
        540, // process_vm_writev
    ];

    pub(super) fn install(sockets: SocketFilter) -> Result<(), String> {
        for program in
            programs(sockets).map_err(|e| format!("cannot build the seccomp filter: {e}"))?
        {
            seccompiler::apply_filter(&program)
                .map_err(|e| format!("cannot install the seccomp filter: {e}"))?;
        }
        Ok(())
    }

    /// Two filters (the kernel runs both on every call): `EPERM` for the
    /// denied calls, and `ENOSYS` for `clone3`, whose flags live in memory a
    /// filter cannot read — glibc then falls back to `clone`, whose flags the
    /// first filter checks.
    fn programs(sockets: SocketFilter) -> Result<[BpfProgram; 2], seccompiler::Error> {
        let mut deny: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        for &nr in DENIED {
            deny.insert(nr, Vec::new());
        }
        match sockets {
            SocketFilter::None => {}
            // An empty chain matches every call.
            SocketFilter::All => {
                deny.insert(libc::SYS_socket, Vec::new());
            }
            SocketFilter::Unix => {
                let unix = SeccompCondition::new(
                    0,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    libc::AF_UNIX as u64,
                )?;
                deny.insert(libc::SYS_socket, vec![SeccompRule::new(vec![unix])?]);
            }
        }
        // Any one namespace flag is enough: the rules of a chain are alternatives.
        let clone_rules = NAMESPACE_FLAGS
            .iter()
            .map(|&flag| {
                let flag = u64::from(flag as u32);
                SeccompRule::new(vec![SeccompCondition::new(
                    0,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(flag),
                    flag,
                )?])
            })
            .collect::<Result<Vec<_>, _>>()?;
        deny.insert(libc::SYS_clone, clone_rules);
        // The conditions of one rule all hold: neither allowed value.
        let personality = PERSONALITY_ALLOWED
            .iter()
            .map(|&allowed| {
                SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, allowed)
            })
            .collect::<Result<Vec<_>, _>>()?;
        deny.insert(libc::SYS_personality, vec![SeccompRule::new(personality)?]);
        let mut enosys: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        enosys.insert(libc::SYS_clone3, Vec::new());
        #[cfg(target_arch = "x86_64")]
        {
            let native: Vec<(i64, Vec<SeccompRule>)> =
                deny.iter().map(|(nr, r)| (*nr, r.clone())).collect();
            for (nr, chain) in native {
                deny.insert(nr | X32_BIT, chain);
            }
            for &nr in X32_ONLY {
                deny.insert(nr | X32_BIT, Vec::new());
            }
            enosys.insert(libc::SYS_clone3 | X32_BIT, Vec::new());
        }
        let arch = std::env::consts::ARCH.try_into()?;
        let errno = |rules, errno: i32| -> Result<BpfProgram, seccompiler::Error> {
            Ok(SeccompFilter::new(
                rules,
                SeccompAction::Allow,
                SeccompAction::Errno(errno as u32),
                arch,
            )?
            .try_into()?)
        };
        Ok([errno(deny, libc::EPERM)?, errno(enosys, libc::ENOSYS)?])
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod imp {
    pub fn install(_: super::SocketFilter) -> Result<(), String> {
        Err(format!(
            "no seccomp filter is built for {}",
            std::env::consts::ARCH
        ))
    }
}

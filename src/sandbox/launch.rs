//! The launcher: `code-executor sandbox-exec [OPTIONS] -- PROGRAM ARGS...`.
//!
//! Stage 1 (in the caller's namespaces) unshares a pid, mount and (unless
//! `--net host`) network namespace, brings loopback up, then forks stage 2
//! and waits for it. Stage 2 is pid 1 of the new pid namespace: it builds a
//! fresh root (see [`build_root`]) holding only the `--read` and `--write`
//! paths, a fresh `/proc` (so only the sandbox's own processes are
//! visible), a minimal `/dev` with a private `/dev/shm` and, with
//! `--scratch`, a size-capped tmpfs over the worker's scratch root; nothing
//! else of the host's tree, so no host socket (`/run`, `/tmp`, ...) can be
//! reached by path.
//!
//! Both stages then confine themselves the same way ([`confine_and_exec`]):
//! a parent-death signal, `--uid/--gid`, every capability dropped,
//! `no_new_privs`, Landlock (files; with `--landlock-net` TCP too; signals
//! and abstract sockets scoped where the kernel can), the seccomp filter
//! (`--seccomp`, `--sockets`), every inherited descriptor but 0-2 marked
//! close-on-exec, and `exec` PROGRAM. Without namespaces (`--no-namespaces`:
//! the container tier) stage 1 does this itself. When PROGRAM (the worker)
//! exits in the namespace tier, the kernel kills everything left in its pid
//! namespace: no process a run starts can outlive its worker.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::IntoRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;
use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use nix::sys::prctl;
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Gid, Uid, pipe2, pivot_root, setgid, setgroups, setuid};

use super::seccomp::SocketFilter;
use super::{Network, netlink};

/// Landlock ABI the filesystem rules are written for; older kernels enforce
/// what they can.
const LANDLOCK_ABI: ABI = ABI::V5;
/// The ABI that scopes signals and abstract Unix sockets to the domain.
const LANDLOCK_SCOPE_ABI: ABI = ABI::V6;

/// Exit status of the launcher when it cannot set the sandbox up.
pub(crate) const SETUP_FAILED: i32 = 125;

/// Options of the hidden `sandbox-exec` subcommand.
#[derive(Debug, Clone, Args)]
pub struct LaunchArgs {
    /// `isolated`: a new network namespace with loopback only; `host`: none.
    #[arg(long, default_value = "isolated")]
    pub net: Network,
    /// Restrict the filesystem with Landlock.
    #[arg(long)]
    pub landlock: bool,
    /// Readable (and executable) path; repeatable.
    #[arg(long = "read")]
    pub read: Vec<PathBuf>,
    /// Readable and writable path; repeatable.
    #[arg(long = "write")]
    pub write: Vec<PathBuf>,
    /// Numeric user to run as.
    #[arg(long)]
    pub uid: Option<u32>,
    /// Numeric group to run as.
    #[arg(long)]
    pub gid: Option<u32>,
    /// Join this cgroup (one of the worker's, one per hierarchy) before
    /// anything else; repeatable.
    #[arg(long = "cgroup")]
    pub cgroup: Vec<PathBuf>,
    /// Join the `--cgroup`s while the program starts instead of before
    /// (namespaces only): joining a v1 cgroup waits out an RCU grace period,
    /// 10-20 ms on a VM, which then overlaps the interpreter's start. The
    /// program gets the read end of a pipe, its number in
    /// `CODE_EXECUTOR_CGROUP_FD`, that carries one byte once it is in them
    /// and ends empty if joining failed; it must read it before it forks.
    #[arg(long)]
    pub join_async: bool,
    /// The pipe of `--join-async` that stage 2 hands to the program.
    #[arg(skip)]
    pub cgroup_fd: Option<i32>,
    /// Make no namespaces (only with `--net host`, on hosts that cannot).
    #[arg(long)]
    pub no_namespaces: bool,
    /// The worker's scratch root: mounted over with a tmpfs of
    /// `--disk-bytes` in the new mount namespace, and the program's working
    /// directory.
    #[arg(long, requires = "disk_bytes")]
    pub scratch: Option<PathBuf>,
    /// Size of the scratch tmpfs: all a worker's runs may write at once.
    #[arg(long, requires = "scratch")]
    pub disk_bytes: Option<u64>,
    /// Install the syscall filter (see `seccomp`) just before `exec`.
    #[arg(long)]
    pub seccomp: bool,
    /// Sockets the filter refuses on top (with `--seccomp`): `unix` (no
    /// `AF_UNIX` socket; `socketpair` stays) or `all` (no socket at all).
    #[arg(long, default_value = "none")]
    pub sockets: SocketFilter,
    /// Landlock also refuses every TCP bind and connect (needs ABI 4).
    #[arg(long)]
    pub landlock_net: bool,
    /// Scope signals and abstract Unix sockets to the program's Landlock
    /// domain (needs ABI 6).
    #[arg(long)]
    pub scope: bool,
    /// Print what this host supports as JSON and exit.
    #[arg(long)]
    pub probe: bool,
    /// The program to run, then its arguments.
    #[arg(last = true)]
    pub command: Vec<OsString>,
}

impl LaunchArgs {
    /// This process's `sandbox-exec ARGS...`, parsed as that subcommand
    /// alone: the launcher starts before every worker, and building the
    /// whole command line's parser would cost it half a millisecond. Bad
    /// arguments print clap's error and exit 2, as they would through
    /// [`crate::config::Cli`].
    pub fn from_command_line() -> LaunchArgs {
        use clap::FromArgMatches;

        let command = LaunchArgs::augment_args(clap::Command::new("code-executor sandbox-exec"));
        let matches = command.get_matches_from(std::env::args_os().skip(1));
        LaunchArgs::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// Run the launcher; never returns.
pub(crate) fn main(args: LaunchArgs) -> ! {
    if args.probe {
        println!("{}", super::probe_here(args.net));
        std::process::exit(0);
    }
    match stage1(&args) {
        Ok(code) => std::process::exit(code),
        Err(message) => {
            eprintln!("code-executor sandbox: {message}");
            std::process::exit(SETUP_FAILED);
        }
    }
}

fn stage1(args: &LaunchArgs) -> Result<i32, String> {
    if args.command.is_empty() {
        return Err("no program to run".into());
    }
    let join_later = args.join_async && !args.no_namespaces && !args.cgroup.is_empty();
    // Opened now: once stage 2 has made the new root, the host's
    // /sys/fs/cgroup is out of this stage's sight too (same mount namespace).
    let mut procs = Vec::new();
    for dir in &args.cgroup {
        let cannot = |e| format!("cannot join cgroup {}: {e}", dir.display());
        let file = super::cgroup::procs_file(dir).map_err(cannot)?;
        if join_later {
            procs.push((dir, file));
        } else {
            super::cgroup::move_into(&file, std::process::id()).map_err(cannot)?;
        }
    }
    if args.no_namespaces {
        // Isolated without a network namespace holds only if no socket can
        // reach anything: the filter refuses them all, Landlock refuses TCP.
        if args.net != Network::Host && !(args.seccomp && args.sockets == SocketFilter::All) {
            return Err("--no-namespaces needs --net host, or --seccomp --sockets all".into());
        }
        if args.scratch.is_some() {
            return Err("--scratch needs a mount namespace (no --no-namespaces)".into());
        }
        return confine_and_exec(args);
    }
    // UTS too: the host's name is not the worker's to see changed or change.
    let mut flags = CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS;
    if args.net == Network::Isolated {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    unshare(flags).map_err(|e| {
        format!(
            "cannot create namespaces ({e}); set network = \"host\" to run without a network namespace"
        )
    })?;
    if args.net == Network::Isolated {
        netlink::loopback_up().map_err(|e| format!("cannot bring loopback up: {e}"))?;
    }
    // Stage 2 is a fork, not a new `exec` of this binary: the launcher has
    // one thread, and a fresh start of the server's binary would cost
    // another millisecond or two before every worker.
    //
    // With --join-async: the end stage 2 (then the program) reads, and the
    // one this stage writes to once stage 2 is in the cgroups.
    let barrier = if join_later {
        Some(pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?)
    } else {
        None
    };
    let child = match crate::sys::fork_single_threaded()
        .map_err(|e| format!("cannot start the sandbox: {e}"))?
    {
        ForkResult::Child => {
            // Nothing of stage 1's is stage 2's but the read end.
            drop(procs);
            let mut args = args.clone();
            args.cgroup_fd = barrier.map(|(read, write)| {
                drop(write);
                read.into_raw_fd()
            });
            let code = stage2(&args).unwrap_or_else(|message| {
                eprintln!("code-executor sandbox: {message}");
                SETUP_FAILED
            });
            std::process::exit(code);
        }
        ForkResult::Parent { child } => child,
    };
    let mut joined = Ok(());
    if let Some((read, write)) = barrier {
        drop(read);
        joined = procs.iter().try_for_each(|(dir, file)| {
            super::cgroup::move_into(file, child.as_raw() as u32)
                .map_err(|e| format!("cannot join cgroup {}: {e}", dir.display()))
        });
        if joined.is_ok() {
            // A program that is gone already has nothing to be told.
            let _ = std::fs::File::from(write).write_all(b"1");
        }
        // Dropped unwritten, the pipe ends empty: the program exits.
    }
    let status = loop {
        match waitpid(child, None) {
            Err(Errno::EINTR) => continue,
            other => break other.map_err(|e| format!("cannot wait for the sandbox: {e}"))?,
        }
    };
    joined?;
    match status {
        WaitStatus::Exited(_, code) => Ok(code),
        WaitStatus::Signaled(_, signal, _) => Ok(128 + signal as i32),
        other => Err(format!("the sandbox ended oddly: {other:?}")),
    }
}

fn stage2(args: &LaunchArgs) -> Result<i32, String> {
    // Die with stage 1 (and so with the server's hold on this worker).
    prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| format!("PR_SET_PDEATHSIG: {e}"))?;
    // Mounts made here stay here.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make mounts private: {e}"))?;
    build_root(args)?;
    // Tells the worker that /dev/shm is its own to empty.
    let fd = args.cgroup_fd.map(|fd| fd.to_string());
    let mut vars = vec![("CODE_EXECUTOR_PRIVATE_SHM", "1")];
    if let Some(fd) = &fd {
        vars.push(("CODE_EXECUTOR_CGROUP_FD", fd.as_str()));
    }
    confine_and_exec_with(args, &vars)
}

/// Make a new root of nothing but what the worker needs and move into it
/// (as bubblewrap does): the `--read` paths bound read-only, the `--write`
/// paths bound writable (the devices among them into a minimal `/dev`),
/// a fresh `/proc`, `/sys` with its cgroups covered, a private `/dev/shm`
/// and the scratch tmpfs. The host's `/run`, `/tmp`, `/var` and home
/// directories, and every socket in them, are simply not there.
///
/// How: a small tmpfs is mounted on some directory and made the root with
/// `pivot_root`, the old root kept at `/oldroot`; the new tree is built
/// under `/newroot` from `/oldroot`'s paths; then `/newroot` becomes the root
/// and the old one is detached.
fn build_root(args: &LaunchArgs) -> Result<(), String> {
    let plan = RootPlan::new(args);
    let base = args.scratch.as_deref().unwrap_or(Path::new("/tmp"));
    mount(
        Some("tmpfs"),
        base,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=1m,mode=0755"),
    )
    .map_err(|e| {
        format!(
            "cannot mount the new root's tmpfs on {}: {e}",
            base.display()
        )
    })?;
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    std::fs::create_dir(base.join("oldroot")).map_err(|e| fail("mkdir oldroot", &e))?;
    pivot_root(base, &base.join("oldroot")).map_err(|e| fail("pivot_root", &e))?;
    std::env::set_current_dir("/").map_err(|e| fail("chdir /", &e))?;
    let new = Path::new("/newroot");
    std::fs::create_dir(new).map_err(|e| fail("mkdir /newroot", &e))?;
    bind(new, new, false)?;
    for link in &plan.links {
        let at = under(new, &link.path);
        make_parent(&at)?;
        std::os::unix::fs::symlink(&link.target, &at)
            .map_err(|e| fail(&format!("symlink {}", at.display()), &e))?;
    }
    for b in &plan.binds {
        let at = under(new, &b.path);
        if !at.exists() {
            make_parent(&at)?;
            if b.dir {
                std::fs::create_dir(&at)
            } else {
                std::fs::write(&at, b"")
            }
            .map_err(|e| fail(&format!("mountpoint {}", at.display()), &e))?;
        }
        bind(&under(Path::new("/oldroot"), &b.path), &at, !b.write)?;
    }
    let proc = new.join("proc");
    std::fs::create_dir_all(&proc).map_err(|e| fail("mkdir /proc", &e))?;
    mount(
        Some("proc"),
        &proc,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| format!("cannot mount /proc: {e}"))?;
    // The cgroup hierarchies hold this worker's own limits: an empty,
    // read-only tmpfs over them, so that not even a root run without
    // Landlock can raise its caps or leave its cgroups.
    let cgroups = under(new, Path::new(CGROUP_ROOT));
    if cgroups.is_dir() {
        mount(
            Some("tmpfs"),
            &cgroups,
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("size=4k,mode=0555"),
        )
        .map_err(|e| format!("cannot cover {CGROUP_ROOT}: {e}"))?;
    }
    // A private /dev/shm (POSIX semaphores and shared memory, which
    // multiprocessing needs), gone with the namespace; the worker empties
    // it between runs.
    let shm = under(new, Path::new(PRIVATE_SHM));
    std::fs::create_dir_all(&shm).map_err(|e| fail("mkdir /dev/shm", &e))?;
    mount(
        Some("tmpfs"),
        &shm,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("size={SHM_BYTES},mode=1777").as_str()),
    )
    .map_err(|e| format!("cannot mount {PRIVATE_SHM}: {e}"))?;
    if let (Some(dir), Some(bytes)) = (&args.scratch, args.disk_bytes) {
        let at = under(new, dir);
        std::fs::create_dir_all(&at).map_err(|e| fail("mkdir scratch", &e))?;
        mount_scratch(&at, bytes, args.uid, args.gid)?;
    }
    // Into the new root; the old one (and the tmpfs it was moved under) go.
    std::env::set_current_dir(new).map_err(|e| fail("chdir /newroot", &e))?;
    pivot_root(".", ".").map_err(|e| fail("pivot_root into the new root", &e))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| fail("detach the old root", &e))?;
    std::env::set_current_dir("/").map_err(|e| fail("chdir /", &e))?;
    // Nothing may be created beside what was bound: the root is read-only.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make the new root read-only: {e}"))?;
    let cwd = args.scratch.as_deref().unwrap_or(Path::new("/"));
    std::env::set_current_dir(cwd).map_err(|e| format!("cannot enter {}: {e}", cwd.display()))
}

/// `path` (absolute) inside `root`.
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn make_parent(path: &Path) -> Result<(), String> {
    match path.parent() {
        Some(parent) => {
            std::fs::create_dir_all(parent).map_err(|e| format!("mkdir {}: {e}", parent.display()))
        }
        None => Ok(()),
    }
}

/// Bind `from` on `to` (with what is mounted below it), read-only if asked.
fn bind(from: &Path, to: &Path, read_only: bool) -> Result<(), String> {
    mount(
        Some(from),
        to,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| format!("cannot bind {} on {}: {e}", from.display(), to.display()))?;
    if read_only {
        mount(
            None::<&str>,
            to,
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID,
            None::<&str>,
        )
        .map_err(|e| format!("cannot make {} read-only: {e}", to.display()))?;
    }
    Ok(())
}

/// What the new root holds, worked out on the host's tree before any
/// mount moves it.
#[derive(Debug, Default)]
struct RootPlan {
    /// Paths bound from the host, outermost first.
    binds: Vec<RootBind>,
    /// Symbolic links made as the host has them (`/lib -> usr/lib`).
    links: Vec<RootLink>,
}

#[derive(Debug)]
struct RootBind {
    path: PathBuf,
    dir: bool,
    write: bool,
}

#[derive(Debug)]
struct RootLink {
    path: PathBuf,
    target: PathBuf,
}

/// Made fresh in the new root, never bound from the host.
const FRESH: &[&str] = &["/proc", "/dev/shm"];
/// The links every `/dev` has (`/dev/fd` is how shells pass descriptors).
const DEV_LINKS: &[(&str, &str)] = &[
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
];
/// Host files in `/etc` that are often links into `/run` (systemd's
/// resolver): their targets are bound too, as files, so that names resolve
/// with `network = "host"`.
const ETC_LINKS: &[&str] = &["/etc/resolv.conf", "/etc/hosts"];

impl RootPlan {
    fn new(args: &LaunchArgs) -> RootPlan {
        let mut plan = RootPlan::default();
        // The whole /dev is not bound: it holds the host's sockets (/dev/log)
        // and devices; only the named devices are.
        let wanted = args
            .read
            .iter()
            .filter(|p| p.as_path() != Path::new("/dev"))
            .map(|p| (p.clone(), false))
            .chain(args.write.iter().map(|p| (p.clone(), true)))
            .chain(ETC_LINKS.iter().filter_map(|l| {
                let p = Path::new(l);
                p.is_symlink()
                    .then(|| std::fs::canonicalize(p).ok())
                    .flatten()
                    .map(|t| (t, false))
            }));
        // The scratch root gets its own tmpfs: nothing of the host's is bound there.
        let fresh_scratch = args
            .scratch
            .as_deref()
            .filter(|_| args.disk_bytes.is_some());
        let mut todo: Vec<(PathBuf, bool)> = wanted.collect();
        let mut seen = 0;
        while seen < todo.len() {
            let (path, write) = todo[seen].clone();
            seen += 1;
            if !path.is_absolute()
                || FRESH.iter().any(|f| path.starts_with(f))
                || fresh_scratch == Some(path.as_path())
            {
                continue;
            }
            if path == Path::new("/proc") || path == Path::new("/") {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                if let Ok(target) = std::fs::read_link(&path)
                    && !plan.links.iter().any(|l| l.path == path)
                {
                    plan.links.push(RootLink {
                        path: path.clone(),
                        target,
                    });
                }
                if let Ok(real) = std::fs::canonicalize(&path) {
                    todo.push((real, write));
                }
                continue;
            }
            plan.binds.push(RootBind {
                path,
                dir: meta.is_dir(),
                write,
            });
        }
        for (path, target) in DEV_LINKS {
            plan.links.push(RootLink {
                path: PathBuf::from(path),
                target: PathBuf::from(target),
            });
        }
        // Outermost first; a path inside one already bound comes with it
        // (unless it is to be writable inside a read-only one).
        plan.binds.sort_by(|a, b| a.path.cmp(&b.path));
        let mut kept: Vec<RootBind> = Vec::new();
        for b in plan.binds {
            let covered = kept
                .iter()
                .any(|k| b.path.starts_with(&k.path) && (k.write || !b.write));
            if !covered {
                kept.push(b);
            }
        }
        plan.binds = kept;
        plan
    }
}

/// Where each worker gets its own tmpfs.
pub(crate) const PRIVATE_SHM: &str = "/dev/shm";
/// Where the cgroup hierarchies are mounted; hidden from workers.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Size of that tmpfs.
pub(crate) const SHM_BYTES: u64 = 64 << 20;

/// Bytes of scratch quota per inode the tmpfs allows, so that empty files
/// (which take no pages) cannot pile up unbounded kernel memory either.
const BYTES_PER_INODE: u64 = 4096;
/// Fewest inodes a scratch tmpfs gets, however small its quota.
const MIN_INODES: u64 = 1024;

/// Cover the scratch root with a tmpfs of `bytes`, owned by the worker's
/// user: whatever the worker and its runs write lands there, and writing
/// past it fails with `ENOSPC`. The launcher's working directory was the
/// covered directory; it moves onto the tmpfs.
fn mount_scratch(dir: &Path, bytes: u64, uid: Option<u32>, gid: Option<u32>) -> Result<(), String> {
    let inodes = (bytes / BYTES_PER_INODE).max(MIN_INODES);
    let mut options = format!("size={bytes},nr_inodes={inodes},mode=0700");
    if let Some(uid) = uid {
        options.push_str(&format!(",uid={uid}"));
    }
    if let Some(gid) = gid {
        options.push_str(&format!(",gid={gid}"));
    }
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .map_err(|e| format!("cannot mount a tmpfs on {}: {e}", dir.display()))?;
    std::env::set_current_dir(dir).map_err(|e| format!("cannot enter {}: {e}", dir.display()))
}

/// Limits, user, `no_new_privs`, Landlock, then `exec` the program.
fn confine_and_exec(args: &LaunchArgs) -> Result<i32, String> {
    confine_and_exec_with(args, &[])
}

/// [`confine_and_exec`], adding `vars` to the program's environment.
fn confine_and_exec_with(args: &LaunchArgs, vars: &[(&str, &str)]) -> Result<i32, String> {
    // No core files: they would land in the run directory and fill it.
    let _ = setrlimit(Resource::RLIMIT_CORE, 0, 0);
    if let Some(gid) = args.gid {
        let gid = Gid::from_raw(gid);
        setgroups(&[gid]).map_err(|e| format!("setgroups: {e}"))?;
        setgid(gid).map_err(|e| format!("setgid: {e}"))?;
    }
    if let Some(uid) = args.uid {
        setuid(Uid::from_raw(uid)).map_err(|e| format!("setuid: {e}"))?;
    }
    drop_capabilities()?;
    prctl::set_no_new_privs().map_err(|e| format!("PR_SET_NO_NEW_PRIVS: {e}"))?;
    if args.landlock {
        restrict_filesystem(args)?;
    }
    if args.scope {
        scope_domain()?;
    }
    // Last: from here on only what the program itself needs may be called.
    if args.seccomp {
        super::seccomp::install(args.sockets)?;
    }
    // Only the protocol pipes (0-2) reach the program, and the cgroup pipe
    // of --join-async, which it closes before it forks.
    crate::sys::cloexec_from_3()
        .map_err(|e| format!("cannot mark descriptors close-on-exec: {e}"))?;
    if let Some(fd) = args.cgroup_fd {
        crate::sys::inherit_fd(fd).map_err(|e| format!("cannot hand the cgroup pipe on: {e}"))?;
    }
    let err = Command::new(&args.command[0])
        .args(&args.command[1..])
        .envs(vars.iter().copied())
        .exec();
    Err(format!("cannot run {:?}: {err}", args.command[0]))
}

/// No capability survives into the program, even for root: the bounding
/// and inheritable sets are emptied (so `exec` grants root nothing), then
/// the ambient, effective and permitted ones. Root inside the sandbox is
/// then an ordinary user that happens to own root's files: it cannot set
/// immutable flags, override file modes, `chroot`, make device nodes or
/// raw sockets, or read another process's memory.
fn drop_capabilities() -> Result<(), String> {
    use caps::CapSet;
    let fail =
        |what: &str, e: caps::errors::CapsError| format!("cannot drop capabilities ({what}): {e}");
    caps::clear(None, CapSet::Ambient).map_err(|e| fail("ambient", e))?;
    let permitted = caps::read(None, CapSet::Permitted).map_err(|e| fail("read", e))?;
    if permitted.contains(&caps::Capability::CAP_SETPCAP) {
        caps::clear(None, CapSet::Bounding).map_err(|e| fail("bounding", e))?;
    }
    caps::clear(None, CapSet::Inheritable).map_err(|e| fail("inheritable", e))?;
    caps::clear(None, CapSet::Effective).map_err(|e| fail("effective", e))?;
    caps::clear(None, CapSet::Permitted).map_err(|e| fail("permitted", e))
}

/// Landlock scopes (ABI 6): the program and its children can signal no
/// process outside their domain (the server, other workers) and connect to
/// no abstract Unix socket made outside it. The layer also handles REFER
/// and grants it everywhere: a layer that handles no filesystem access
/// would refuse every rename across directories (`EXDEV`, Landlock's ABI 1
/// compatibility).
fn scope_domain() -> Result<(), String> {
    let root = PathFd::new("/").map_err(|e| format!("landlock scopes: {e}"))?;
    Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::Refer)
        .and_then(|r| r.scope(Scope::from_all(LANDLOCK_SCOPE_ABI)))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rule(PathBeneath::new(root, AccessFs::Refer)))
        .and_then(|r| r.restrict_self())
        .map(|_| ())
        .map_err(|e| format!("landlock scopes: {e}"))
}

/// Landlock: read (and execute) `--read` paths, read and write `--write`
/// paths, nothing else. Fails unless the kernel enforces the ruleset.
fn restrict_filesystem(args: &LaunchArgs) -> Result<(), String> {
    let all = AccessFs::from_all(LANDLOCK_ABI);
    let read = AccessFs::from_read(LANDLOCK_ABI);
    let mut ruleset = Ruleset::default().handle_access(all);
    if args.landlock_net {
        // Handled with no rule: no port may be bound or connected to.
        ruleset = ruleset.and_then(|r| {
            r.set_compatibility(CompatLevel::HardRequirement)
                .handle_access(AccessNet::from_all(ABI::V4))
        });
    }
    let status = ruleset
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(path_beneath_rules(&args.read, read)))
        .and_then(|r| r.add_rules(path_beneath_rules(&args.write, all)))
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("landlock: {e}"))?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err("landlock is not enforced by this kernel".into());
    }
    Ok(())
}

//! The launcher: `code-executor sandbox-exec [OPTIONS] -- PROGRAM ARGS...`.
//!
//! Stage 1 (in the caller's namespaces) unshares a pid, mount and (unless
//! `--net host`) network namespace, brings loopback up, then starts stage 2
//! (itself again, with `--stage2`) and waits for it. Stage 2 is pid 1 of the
//! new pid namespace: it mounts a fresh `/proc` (so only the sandbox's own
//! processes are visible), a private `/dev/shm` and, with `--scratch`, a
//! size-capped tmpfs over the worker's scratch root; sets a parent-death
//! signal, drops to `--uid/--gid`, sets `no_new_privs`, restricts itself with
//! Landlock, installs the seccomp filter (`--seccomp`) and `exec`s PROGRAM.
//! When PROGRAM (the worker) exits, the kernel kills everything left in its
//! pid namespace: no process a run starts can outlive its worker.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;
use landlock::{
    ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    path_beneath_rules,
};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::sys::prctl;
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, setgid, setgroups, setuid};

use super::{Network, netlink};

/// Landlock ABI the rules are written for; older kernels enforce what they can.
const LANDLOCK_ABI: ABI = ABI::V5;

/// Exit status of the launcher when it cannot set the sandbox up.
pub const SETUP_FAILED: i32 = 125;

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
    /// Internal: this process is pid 1 of the new namespaces.
    #[arg(long, hide = true)]
    pub stage2: bool,
    /// Print what this host supports as JSON and exit.
    #[arg(long)]
    pub probe: bool,
    /// The program to run, then its arguments.
    #[arg(last = true)]
    pub command: Vec<OsString>,
}

/// Run the launcher; never returns.
pub fn main(args: LaunchArgs) -> ! {
    if args.probe {
        println!("{}", super::probe_here(args.net));
        std::process::exit(0);
    }
    let result = if args.stage2 {
        stage2(&args)
    } else {
        stage1(&args)
    };
    match result {
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
    for dir in &args.cgroup {
        super::cgroup::join(dir)
            .map_err(|e| format!("cannot join cgroup {}: {e}", dir.display()))?;
    }
    if args.no_namespaces {
        if args.net != Network::Host {
            return Err("--no-namespaces needs --net host".into());
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
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("sandbox-exec")
        .arg("--stage2")
        .args(stage2_args(args));
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start the sandbox: {e}"))?;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

fn stage2_args(args: &LaunchArgs) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec!["--net".into(), args.net.as_str().into()];
    if args.landlock {
        out.push("--landlock".into());
    }
    if args.seccomp {
        out.push("--seccomp".into());
    }
    if let (Some(dir), Some(bytes)) = (&args.scratch, args.disk_bytes) {
        out.push("--scratch".into());
        out.push(dir.into());
        out.push("--disk-bytes".into());
        out.push(bytes.to_string().into());
    }
    for p in &args.read {
        out.push("--read".into());
        out.push(p.into());
    }
    for p in &args.write {
        out.push("--write".into());
        out.push(p.into());
    }
    if let Some(uid) = args.uid {
        out.push("--uid".into());
        out.push(uid.to_string().into());
    }
    if let Some(gid) = args.gid {
        out.push("--gid".into());
        out.push(gid.to_string().into());
    }
    out.push("--".into());
    out.extend(args.command.iter().cloned());
    out
}

fn stage2(args: &LaunchArgs) -> Result<i32, String> {
    // Die with stage 1 (and so with the server's hold on this worker).
    prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| format!("PR_SET_PDEATHSIG: {e}"))?;
    // Mounts made here stay here; a fresh /proc shows this namespace only.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make mounts private: {e}"))?;
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| format!("cannot mount /proc: {e}"))?;
    // The cgroup hierarchies hold this worker's own limits: an empty,
    // read-only tmpfs over them, so that not even a root run without
    // Landlock can raise its caps or leave its cgroups.
    if std::path::Path::new(CGROUP_ROOT).is_dir() {
        mount(
            Some("tmpfs"),
            CGROUP_ROOT,
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("size=4k,mode=0555"),
        )
        .map_err(|e| format!("cannot cover {CGROUP_ROOT}: {e}"))?;
    }
    if let (Some(dir), Some(bytes)) = (&args.scratch, args.disk_bytes) {
        mount_scratch(dir, bytes, args.uid, args.gid)?;
    }
    // A private /dev/shm (POSIX semaphores and shared memory, which
    // multiprocessing needs), gone with the namespace; the worker empties
    // it between runs.
    if std::path::Path::new(PRIVATE_SHM).is_dir() {
        mount(
            Some("tmpfs"),
            PRIVATE_SHM,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(format!("size={SHM_BYTES},mode=1777").as_str()),
        )
        .map_err(|e| format!("cannot mount {PRIVATE_SHM}: {e}"))?;
        // Tells the worker that /dev/shm is its own to empty.
        return confine_and_exec_with(args, &[("CODE_EXECUTOR_PRIVATE_SHM", "1")]);
    }
    confine_and_exec(args)
}

/// Where each worker gets its own tmpfs.
pub const PRIVATE_SHM: &str = "/dev/shm";
/// Where the cgroup hierarchies are mounted; hidden from workers.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Size of that tmpfs.
pub const SHM_BYTES: u64 = 64 << 20;

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
    prctl::set_no_new_privs().map_err(|e| format!("PR_SET_NO_NEW_PRIVS: {e}"))?;
    if args.landlock {
        restrict_filesystem(args)?;
    }
    // Last: from here on only what the program itself needs may be called.
    if args.seccomp {
        super::seccomp::install()?;
    }
    let err = Command::new(&args.command[0])
        .args(&args.command[1..])
        .envs(vars.iter().copied())
        .exec();
    Err(format!("cannot run {:?}: {err}", args.command[0]))
}

/// Landlock: read (and execute) `--read` paths, read and write `--write`
/// paths, nothing else. Fails unless the kernel enforces the ruleset.
fn restrict_filesystem(args: &LaunchArgs) -> Result<(), String> {
    let all = AccessFs::from_all(LANDLOCK_ABI);
    let read = AccessFs::from_read(LANDLOCK_ABI);
    let status = Ruleset::default()
        .handle_access(all)
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

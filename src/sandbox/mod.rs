//! The sandbox around every worker: what the host offers, and how a worker
//! is started through the launcher (`code-executor sandbox-exec`, see
//! [`launch`]) so that namespaces, the scratch quota, Landlock,
//! `no_new_privs`, the `run_as` user and the syscall filter ([`seccomp`])
//! apply to the interpreter from its first instruction.
//!
//! The server never runs code between `fork` and `exec` itself once it has
//! threads: the launcher is this same binary, re-executed, which sets the
//! sandbox up on itself. Only the host's probe may be forked, by
//! [`probe_early`], before the binary starts its runtime.

pub(crate) mod cgroup;
pub(crate) mod launch;
mod netlink;
pub(crate) mod seccomp;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cgroup::{CgroupRoot, Controller};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr, Scope,
};
use nix::sched::{CloneFlags, unshare};
use seccomp::SocketFilter;
use serde::{Deserialize, Serialize};

/// Directories every interpreter needs to read: system libraries, configuration
/// (`ld.so.cache`, certificates, time zones), the sandbox's own `/proc`, `/sys`
/// (CPU counts) and `/dev`.
const SYSTEM_READ: &[&str] = &[
    "/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc", "/sys", "/dev",
];

/// Device files a run may also write.
const DEVICE_WRITE: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// A worker's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Its own network namespace with loopback only (the default).
    #[default]
    #[value(alias = "none")]
    #[serde(alias = "none")]
    Isolated,
    /// The host's network: an explicit opt-out.
    Host,
}

impl Network {
    /// The name `/health` and the config use.
    pub fn as_str(self) -> &'static str {
        match self {
            Network::Isolated => "isolated",
            Network::Host => "host",
        }
    }
}

/// Which set of mechanisms confines workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TierChoice {
    /// Namespaces where the host can make them, else the container tier.
    #[default]
    Auto,
    /// Namespaces or refuse to start.
    Namespaces,
    /// The container tier even where namespaces could be made.
    Container,
}

/// The tier in force, as `/health` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tier {
    /// Pid, mount, network and UTS namespaces per worker, a fresh root.
    Namespaces,
    /// What an unprivileged process in a container still has: seccomp
    /// socket rules and Landlock instead of the namespaces.
    Container,
}

impl Tier {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Tier::Namespaces => "namespaces",
            Tier::Container => "container",
        }
    }
}

/// How workers are sandboxed (the `[sandbox]`-level keys of the config).
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Start workers through the launcher. Off only for debugging: then
    /// nothing but rlimits confines a run.
    pub enabled: bool,
    /// The binary with the `sandbox-exec` subcommand (default: this one).
    pub launcher: Option<PathBuf>,
    /// Network of workers whose env sets none.
    pub network: Network,
    /// Confine the filesystem with Landlock when the kernel has it.
    pub landlock: bool,
    /// User (name or uid) workers run as; the server's own when absent.
    pub run_as: Option<String>,
    /// Group (name or gid) workers run as; the user's primary group when absent.
    pub run_as_group: Option<String>,
    /// Size of each worker's scratch tmpfs (all its runs' files at once) for
    /// envs that set none.
    pub disk_bytes: u64,
    /// Which tier to use (`auto`: namespaces where the host can make them).
    pub tier: TierChoice,
}

/// Default size of a worker's scratch tmpfs.
pub const DEFAULT_DISK_BYTES: u64 = 256 << 20;

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            enabled: true,
            launcher: None,
            network: Network::Isolated,
            landlock: true,
            run_as: None,
            run_as_group: None,
            disk_bytes: DEFAULT_DISK_BYTES,
            tier: TierChoice::Auto,
        }
    }
}

/// What this host enforces, as `/health` reports it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SandboxStatus {
    /// Workers start through the launcher.
    pub enabled: bool,
    /// `"namespaces"` (a pid, mount, network and UTS namespace and a fresh
    /// root per worker), `"container"` (no namespaces: seccomp and Landlock
    /// keep the network isolated and the host's sockets out of reach), or
    /// `"none"` with the sandbox disabled.
    pub tier: String,
    /// Every mechanism in force, by name (`pid_namespace`, `fresh_root`,
    /// `landlock_fs`, `landlock_net`, `landlock_scope`, `seccomp`,
    /// `seccomp_no_sockets`, `seccomp_no_unix_sockets`, `no_new_privs`,
    /// `no_capabilities`, `subreaper`, `rlimits`, `pids_cgroup`,
    /// `memory_cgroup`, `scratch_tmpfs`, `non_dumpable`, ...).
    pub mechanisms: Vec<String>,
    /// A pid and mount namespace per worker (own `/proc`, no process outlives it).
    pub pid_namespace: bool,
    /// A network namespace per worker (loopback only) can be made.
    pub network_namespace: bool,
    /// Landlock filesystem confinement is enforced.
    pub landlock: bool,
    /// `PR_SET_NO_NEW_PRIVS` is set on every worker.
    pub no_new_privs: bool,
    /// Per-run rlimits applied by the bootstrap.
    pub rlimits: Vec<String>,
    /// Whether workers run as another user.
    pub run_as: bool,
    /// A pids cgroup per worker caps processes and threads (`"v1"`, `"v2"`),
    /// or `null`: then only `RLIMIT_NPROC` does, which binds no root worker.
    pub pids_cgroup: Option<&'static str>,
    /// What bounds memory: `"cgroup_v2"` or `"cgroup_v1"` (a memory cgroup
    /// per worker caps the worker and its run together, on top of each
    /// run's `RLIMIT_AS`), or `"rlimit_as"` (the address space of each
    /// process of a run only).
    pub memory: &'static str,
    /// Each worker's scratch root (its runs' directories and temp dirs) is a
    /// size-capped tmpfs in its own mount namespace: writing past it fails
    /// with `ENOSPC`. False without mount namespaces: then nothing caps the
    /// total a run writes but the filesystem's free space.
    pub disk_quota: bool,
    /// The scratch tmpfs size of each env's workers, when `disk_quota` holds.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub disk_bytes: BTreeMap<String, u64>,
    /// Size of each worker's private `/dev/shm`, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shm_bytes: Option<u64>,
    /// A seccomp filter denies workers the system calls a run never needs
    /// (`ptrace`, `mount`, `unshare`, `bpf`, `perf_event_open`, `keyctl`, ...).
    pub seccomp: bool,
    /// Why something the config asked for is missing, if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// Errors setting the sandbox up at server start.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot run the sandbox launcher {0}")]
    Launcher(PathBuf, #[source] std::io::Error),
    #[error("the sandbox launcher {0} gave an unreadable answer: {1}")]
    Probe(PathBuf, String),
    #[error(
        "workers cannot get their own namespaces on this host ({0}), and sandbox_tier = \"namespaces\" asks for them"
    )]
    NoNamespaces(String),
    #[error(
        "isolated networking cannot be enforced on this host: no namespaces ({namespaces}) and no seccomp filter ({seccomp}); set network = \"host\" to run workers on the host's network"
    )]
    NoIsolation { namespaces: String, seccomp: String },
    #[error("unknown run_as user {0:?}")]
    UnknownUser(String),
    #[error("unknown run_as group {0:?}")]
    UnknownGroup(String),
}

/// What the probe finds, printed by `sandbox-exec --probe` as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ProbeReport {
    namespaces: Result<(), String>,
    landlock: bool,
    /// Landlock can refuse TCP bind and connect (ABI 4).
    #[serde(default)]
    landlock_net: bool,
    /// Landlock can scope signals and abstract sockets (ABI 6).
    #[serde(default)]
    landlock_scope: bool,
    /// Whether the syscall filter can be installed (and is built for this
    /// architecture); a launcher that does not say has none.
    #[serde(default = "unreported")]
    seccomp: Result<(), String>,
}

fn unreported() -> Result<(), String> {
    Err("the launcher does not report it".into())
}

/// The host's probe, forked by [`probe_early`]: the child and the pipe its
/// report comes down.
struct EarlyProbe {
    child: nix::unistd::Pid,
    report: std::fs::File,
}

/// Taken by the first [`Sandbox::probe`]; its report stands for the default
/// launcher's only.
static EARLY_PROBE: parking_lot::Mutex<Option<EarlyProbe>> = parking_lot::Mutex::new(None);

/// Probe the host now, in a forked child, while the process still has one
/// thread (the binary calls this before it starts its runtime): the report
/// is then ready when the start needs it, instead of a launcher start of
/// its own on the path to the first worker (~3 ms). If anything here
/// fails, the start probes through the launcher as before.
pub(crate) fn probe_early() {
    use std::io::Write;

    let Ok((read, write)) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) else {
        return;
    };
    match crate::sys::fork_single_threaded() {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(read);
            // The child's own namespaces, domain and filter: nothing of this
            // reaches the server.
            let report = probe_here(Network::Isolated);
            let code = i32::from(
                std::fs::File::from(write)
                    .write_all(report.as_bytes())
                    .is_err(),
            );
            std::process::exit(code);
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            *EARLY_PROBE.lock() = Some(EarlyProbe {
                child,
                report: std::fs::File::from(read),
            });
        }
        Err(_) => {}
    }
}

impl EarlyProbe {
    /// The child's report, once it has exited cleanly; blocks.
    fn wait(mut self) -> Option<String> {
        use std::io::Read;

        let mut text = String::new();
        let read = self.report.read_to_string(&mut text);
        let status = loop {
            match nix::sys::wait::waitpid(self.child, None) {
                Err(nix::errno::Errno::EINTR) => continue,
                other => break other,
            }
        };
        let clean = matches!(status, Ok(nix::sys::wait::WaitStatus::Exited(_, 0)));
        (read.is_ok() && clean).then_some(text)
    }
}

/// Run inside the launcher: try what the sandbox needs, on this process only.
pub(crate) fn probe_here(net: Network) -> String {
    let mut flags = CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWNS;
    if net == Network::Isolated {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    let namespaces = unshare(flags).map_err(|e| e.desc().to_string());
    let strict = || Ruleset::default().set_compatibility(CompatLevel::HardRequirement);
    let landlock = strict()
        .handle_access(AccessFs::from_all(ABI::V1))
        .and_then(|r| r.create())
        .is_ok();
    let landlock_net = strict()
        .handle_access(AccessNet::from_all(ABI::V4))
        .and_then(|r| r.create())
        .is_ok();
    let landlock_scope = strict()
        .scope(Scope::from_all(ABI::V6))
        .and_then(|r| r.create())
        .is_ok();
    // Last, as in the launcher: the filter forbids the calls above.
    let seccomp = nix::sys::prctl::set_no_new_privs()
        .map_err(|e| format!("PR_SET_NO_NEW_PRIVS: {e}"))
        .and_then(|()| seccomp::install(SocketFilter::All));
    serde_json::to_string(&ProbeReport {
        namespaces,
        landlock,
        landlock_net,
        landlock_scope,
        seccomp,
    })
    .unwrap_or_default()
}

/// How to wrap one env's workers; built once per pool.
#[derive(Debug, Clone)]
pub struct SandboxPlan {
    pub launcher: PathBuf,
    pub network: Network,
    pub landlock: bool,
    /// Landlock refuses TCP bind and connect (the container tier's isolated
    /// network, where the kernel can).
    pub landlock_net: bool,
    /// Sockets the seccomp filter refuses.
    pub sockets: SocketFilter,
    /// Landlock scopes signals and abstract sockets to each worker's domain.
    pub scope: bool,
    /// Whether to unshare namespaces (false only for `network = "host"` on a
    /// host that cannot make them).
    pub namespaces: bool,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Paths the worker may read besides the system ones.
    pub read: Vec<PathBuf>,
    /// Where each worker gets its pids and memory cgroups, if the host has them.
    pub cgroups: Option<Arc<CgroupRoot>>,
    /// Size of the tmpfs over each worker's scratch root; `None` without
    /// mount namespaces (no quota).
    pub disk_bytes: Option<u64>,
    /// Install the syscall filter.
    pub seccomp: bool,
}

impl SandboxPlan {
    /// The program and arguments that start `python args...` inside the sandbox,
    /// writable only at `scratch`.
    pub fn command(
        &self,
        python: &Path,
        args: &[OsString],
        scratch: &Path,
        cgroups: &[PathBuf],
    ) -> Vec<OsString> {
        let mut out: Vec<OsString> = vec![
            "sandbox-exec".into(),
            "--net".into(),
            self.network.as_str().into(),
            "--sockets".into(),
            self.sockets.as_str().into(),
        ];
        for dir in cgroups {
            out.push("--cgroup".into());
            out.push(dir.into());
        }
        if !self.namespaces {
            out.push("--no-namespaces".into());
        } else if !cgroups.is_empty() {
            // The worker's launch code waits for the join (see LAUNCH).
            out.push("--join-async".into());
        }
        if let Some(bytes) = self.disk_bytes {
            out.push("--scratch".into());
            out.push(scratch.into());
            out.push("--disk-bytes".into());
            out.push(bytes.to_string().into());
        }
        if self.seccomp {
            out.push("--seccomp".into());
        }
        if self.landlock {
            out.push("--landlock".into());
        }
        if self.landlock_net {
            out.push("--landlock-net".into());
        }
        if self.scope {
            out.push("--scope".into());
        }
        // What Landlock allows, and in the namespace tier all that the
        // worker's fresh root holds.
        for p in SYSTEM_READ
            .iter()
            .map(Path::new)
            .chain(self.read.iter().map(PathBuf::as_path))
        {
            out.push("--read".into());
            out.push(p.into());
        }
        // With namespaces, /dev/shm is a private tmpfs (see `launch`); in
        // the container tier it is the container's, shared by its workers
        // (POSIX semaphores, which multiprocessing needs, live there).
        let shm = Some(Path::new(launch::PRIVATE_SHM));
        for p in DEVICE_WRITE
            .iter()
            .map(Path::new)
            .chain(shm)
            .chain(std::iter::once(scratch))
        {
            out.push("--write".into());
            out.push(p.into());
        }
        if let Some(uid) = self.uid {
            out.push("--uid".into());
            out.push(uid.to_string().into());
        }
        if let Some(gid) = self.gid {
            out.push("--gid".into());
            out.push(gid.to_string().into());
        }
        out.push("--".into());
        out.push(python.into());
        out.extend(args.iter().cloned());
        out
    }
}

/// The host's sandbox, probed once at start.
#[derive(Debug, Clone)]
pub(crate) struct Sandbox {
    pub status: SandboxStatus,
    launcher: PathBuf,
    landlock: bool,
    /// Landlock can refuse TCP (used by the container tier).
    landlock_net: bool,
    /// Landlock can scope signals and abstract sockets (ABI 6).
    scope: bool,
    tier: Tier,
    namespaces: bool,
    seccomp: bool,
    uid: Option<u32>,
    gid: Option<u32>,
    cgroups: Option<Arc<CgroupRoot>>,
}

impl Sandbox {
    /// The report of `launcher sandbox-exec --probe`.
    async fn probe_through(launcher: &Path) -> Result<ProbeReport, SandboxError> {
        let out = tokio::process::Command::new(launcher)
            .args(["sandbox-exec", "--probe"])
            .env_clear()
            .output()
            .await
            .map_err(|e| SandboxError::Launcher(launcher.to_path_buf(), e))?;
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim()).map_err(|_| {
            SandboxError::Probe(
                launcher.to_path_buf(),
                format!("{}{}", text.trim(), String::from_utf8_lossy(&out.stderr)),
            )
        })
    }

    /// Probe the host: through the early probe's report (see
    /// [`probe_early`]) where there is one and no launcher is configured,
    /// else through the launcher. Fails when namespaces cannot be made and
    /// some env keeps its network isolated (never a silent downgrade); a
    /// missing Landlock is logged loudly and reported.
    pub(crate) async fn probe(
        config: &SandboxConfig,
        networks: &[Network],
    ) -> Result<Option<Sandbox>, SandboxError> {
        // The early probe is reaped whatever the configuration says.
        let early = EARLY_PROBE.lock().take();
        let early = match early {
            Some(probe) => tokio::task::spawn_blocking(move || probe.wait())
                .await
                .ok()
                .flatten(),
            None => None,
        };
        if !config.enabled {
            tracing::warn!(
                "the sandbox is disabled: runs are confined by rlimits only and share the host's network and filesystem"
            );
            return Ok(None);
        }
        let launcher = match &config.launcher {
            Some(p) => p.clone(),
            None => std::env::current_exe()
                .map_err(|e| SandboxError::Launcher(PathBuf::from("code-executor"), e))?,
        };
        // Its report stands for the default launcher's only.
        let early = early
            .filter(|_| config.launcher.is_none())
            .and_then(|text| serde_json::from_str::<ProbeReport>(text.trim()).ok());
        let forked = early.is_some();
        let report = match early {
            Some(report) => report,
            None => Self::probe_through(&launcher).await?,
        };
        tracing::debug!(forked, ?report, "host probed");
        let isolated = networks.contains(&Network::Isolated);
        let seccomp = report.seccomp.is_ok();
        let tier = match (&report.namespaces, config.tier) {
            (Ok(()), TierChoice::Auto | TierChoice::Namespaces) => Tier::Namespaces,
            (Err(reason), TierChoice::Namespaces) => {
                return Err(SandboxError::NoNamespaces(reason.clone()));
            }
            (Err(reason), TierChoice::Auto) => {
                if isolated && !seccomp {
                    return Err(SandboxError::NoIsolation {
                        namespaces: reason.clone(),
                        seccomp: report.seccomp.clone().err().unwrap_or_default(),
                    });
                }
                tracing::warn!(
                    "workers cannot get their own namespaces ({reason}): using the container tier (seccomp socket rules and Landlock instead; see /health sandbox.mechanisms)"
                );
                Tier::Container
            }
            (_, TierChoice::Container) => {
                if isolated && !seccomp {
                    return Err(SandboxError::NoIsolation {
                        namespaces: "sandbox_tier = \"container\" makes none".into(),
                        seccomp: report.seccomp.clone().err().unwrap_or_default(),
                    });
                }
                Tier::Container
            }
        };
        let namespaces = tier == Tier::Namespaces;
        // Why something asked for is missing, each said once at start.
        let mut problems: Vec<String> = Vec::new();
        let landlock = config.landlock && report.landlock;
        if config.landlock && !report.landlock {
            tracing::error!(
                "LANDLOCK IS NOT AVAILABLE on this kernel: runs can read and write every file the worker user can; see SECURITY.md"
            );
            problems.push("landlock is not available on this kernel".into());
        }
        if !namespaces {
            tracing::warn!(
                "workers have no mount namespace: the scratch quota (disk_bytes) is not enforced, only the size of each file is, and limits.disk_bytes is refused"
            );
            problems.push("disk_bytes is not enforced without mount namespaces".into());
        }
        if let Err(reason) = &report.seccomp {
            tracing::error!(
                "NO SECCOMP FILTER: workers may make every system call the kernel offers ({reason}); see SECURITY.md"
            );
            problems.push(format!("no seccomp filter: {reason}"));
            if !namespaces {
                problems.push(
                    "host Unix sockets are reachable by path: no mount namespace and no seccomp filter"
                        .into(),
                );
            }
        }
        if !report.landlock_scope {
            problems.push(
                "landlock cannot scope signals (ABI 6): a run may signal processes of the same user outside its worker"
                    .into(),
            );
        }
        let problem = (!problems.is_empty()).then(|| problems.join("; "));
        let (uid, gid) = resolve_user(config)?;
        let cgroups = CgroupRoot::create().map(Arc::new);
        let version = |c| cgroups.as_ref().and_then(|r| r.version(c));
        if version(Controller::Pids).is_none() {
            tracing::warn!(
                "no writable pids cgroup: the process/thread cap of runs is RLIMIT_NPROC only"
            );
        }
        if version(Controller::Memory).is_none() {
            tracing::warn!(
                "no writable memory cgroup: memory is bounded by each process's RLIMIT_AS only"
            );
        }
        let landlock_net = landlock && report.landlock_net;
        let mut mechanisms: Vec<&str> = Vec::new();
        if namespaces {
            mechanisms.extend([
                "pid_namespace",
                "mount_namespace",
                "uts_namespace",
                "fresh_root",
            ]);
            if isolated {
                mechanisms.push("network_namespace");
            }
            mechanisms.push("scratch_tmpfs");
        }
        if landlock {
            mechanisms.push("landlock_fs");
        }
        if !namespaces && isolated && landlock_net {
            mechanisms.push("landlock_net");
        }
        if report.landlock_scope {
            mechanisms.push("landlock_scope");
        }
        if seccomp {
            mechanisms.push("seccomp");
            if !namespaces {
                mechanisms.push(if isolated {
                    "seccomp_no_sockets"
                } else {
                    "seccomp_no_unix_sockets"
                });
            }
        }
        mechanisms.extend([
            "no_new_privs",
            "no_capabilities",
            "subreaper",
            "rlimits",
            "non_dumpable",
        ]);
        if version(Controller::Pids).is_some() {
            mechanisms.push("pids_cgroup");
        }
        if version(Controller::Memory).is_some() {
            mechanisms.push("memory_cgroup");
        }
        Ok(Some(Sandbox {
            status: SandboxStatus {
                enabled: true,
                tier: tier.as_str().into(),
                mechanisms: mechanisms.iter().map(|m| m.to_string()).collect(),
                pid_namespace: namespaces,
                network_namespace: namespaces && networks.contains(&Network::Isolated),
                landlock,
                no_new_privs: true,
                rlimits: Vec::new(),
                run_as: uid.is_some(),
                pids_cgroup: version(Controller::Pids).map(|v| v.as_str()),
                memory: match version(Controller::Memory) {
                    Some(cgroup::CgroupVersion::V1) => "cgroup_v1",
                    Some(cgroup::CgroupVersion::V2) => "cgroup_v2",
                    None => "rlimit_as",
                },
                disk_quota: namespaces,
                disk_bytes: BTreeMap::new(),
                shm_bytes: namespaces.then_some(launch::SHM_BYTES),
                seccomp,
                problem,
            },
            launcher,
            landlock,
            landlock_net,
            scope: report.landlock_scope,
            tier,
            namespaces,
            seccomp,
            uid,
            gid,
            cgroups,
        }))
    }

    /// The plan for one env's workers: `python` is its interpreter,
    /// `disk_bytes` the size of each worker's scratch tmpfs.
    pub(crate) fn plan(&self, network: Network, disk_bytes: u64, python: &Path) -> SandboxPlan {
        let read = interpreter_paths(python);
        SandboxPlan {
            launcher: self.launcher.clone(),
            network,
            landlock: self.landlock,
            landlock_net: self.tier == Tier::Container
                && network == Network::Isolated
                && self.landlock_net,
            sockets: match (self.tier, network) {
                (Tier::Namespaces, _) => SocketFilter::None,
                (Tier::Container, Network::Isolated) => SocketFilter::All,
                (Tier::Container, Network::Host) => SocketFilter::Unix,
            },
            scope: self.scope,
            namespaces: self.namespaces,
            uid: self.uid,
            gid: self.gid,
            read,
            cgroups: self.cgroups.clone(),
            disk_bytes: self.namespaces.then_some(disk_bytes),
            seccomp: self.seccomp,
        }
    }

    /// Whether workers get network namespaces of their own (the namespace
    /// tier with an isolated network): what the egress proxy needs.
    pub(crate) fn has_network_namespaces(&self) -> bool {
        self.tier == Tier::Namespaces && self.namespaces
    }

    /// Where the workers' cgroups are made, if the host has a hierarchy.
    pub(crate) fn cgroups(&self) -> Option<Arc<CgroupRoot>> {
        self.cgroups.clone()
    }

    /// The user workers run as, if not the server's.
    pub(crate) fn owner(&self) -> Option<(u32, u32)> {
        self.uid.map(|u| (u, self.gid.unwrap_or(u)))
    }
}

/// What an interpreter needs to read: its prefix, the prefix of the binary
/// it resolves to, where the prefix's `bin/` and `lib/` symlinks point
/// (venvs and linked envs; for a standard library linked entry by entry from
/// another installation, that installation's whole `lib/`, which also holds
/// its `libpython`), and a venv's base (`pyvenv.cfg` `home`).
/// Landlock checks the resolved path of every open, so a symlinked library
/// is readable only if its target is.
fn interpreter_paths(python: &Path) -> Vec<PathBuf> {
    let mut read: Vec<PathBuf> = Vec::new();
    let mut add = |p: PathBuf| {
        if !read.contains(&p) {
            read.push(p);
        }
    };
    let prefix = python
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    if let Some(prefix) = &prefix {
        add(prefix.clone());
        for dir in ["bin", "lib"] {
            let Ok(entries) = std::fs::read_dir(prefix.join(dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                if kind.is_symlink() {
                    if let Ok(target) = std::fs::canonicalize(entry.path()) {
                        add(target);
                    }
                } else if dir == "lib"
                    && kind.is_dir()
                    && entry.file_name().to_string_lossy().starts_with("python")
                {
                    linked_stdlib(&entry.path(), &mut add);
                }
            }
        }
        if let Ok(cfg) = std::fs::read_to_string(prefix.join("pyvenv.cfg")) {
            for line in cfg.lines() {
                if let Some((key, value)) = line.split_once('=')
                    && key.trim() == "home"
                    && let Some(base) = Path::new(value.trim()).parent()
                {
                    add(base.to_path_buf());
                }
            }
        }
    }
    if let Some(real) = std::fs::canonicalize(python)
        .ok()
        .and_then(|p| p.parent().and_then(Path::parent).map(Path::to_path_buf))
    {
        add(real);
    }
    read
}

/// The real `lib/` of a standard library whose entries are symlinks.
fn linked_stdlib(stdlib: &Path, add: &mut impl FnMut(PathBuf)) {
    let Ok(entries) = std::fs::read_dir(stdlib) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_symlink())
            && let Some(lib) = std::fs::canonicalize(entry.path())
                .ok()
                .and_then(|t| t.parent().and_then(Path::parent).map(Path::to_path_buf))
        {
            add(lib);
            return;
        }
    }
}

fn resolve_user(config: &SandboxConfig) -> Result<(Option<u32>, Option<u32>), SandboxError> {
    use nix::unistd::{Group, User};
    let mut uid = None;
    let mut gid = None;
    if let Some(name) = &config.run_as {
        let user = match name.parse::<u32>() {
            Ok(n) => User::from_uid(n.into()).ok().flatten(),
            Err(_) => User::from_name(name).ok().flatten(),
        };
        match (user, name.parse::<u32>()) {
            (Some(u), _) => {
                uid = Some(u.uid.as_raw());
                gid = Some(u.gid.as_raw());
            }
            (None, Ok(n)) => {
                uid = Some(n);
                gid = Some(n);
            }
            (None, Err(_)) => return Err(SandboxError::UnknownUser(name.clone())),
        }
    }
    if let Some(name) = &config.run_as_group {
        gid = Some(match name.parse::<u32>() {
            Ok(n) => n,
            Err(_) => Group::from_name(name)
                .ok()
                .flatten()
                .map(|g| g.gid.as_raw())
                .ok_or_else(|| SandboxError::UnknownGroup(name.clone()))?,
        });
    }
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(namespaces: bool) -> SandboxPlan {
        SandboxPlan {
            launcher: PathBuf::from("/bin/code-executor"),
            network: Network::Host,
            landlock: false,
            landlock_net: false,
            sockets: SocketFilter::None,
            scope: false,
            namespaces,
            uid: None,
            gid: None,
            read: Vec::new(),
            cgroups: None,
            disk_bytes: namespaces.then_some(1 << 20),
            seccomp: true,
        }
    }

    fn words(plan: &SandboxPlan) -> Vec<String> {
        plan.command(Path::new("/py"), &[], Path::new("/scratch/w"), &[])
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_scratch_quota_needs_a_mount_namespace() {
        let with = words(&plan(true));
        let at = with.iter().position(|w| w == "--scratch").unwrap();
        assert_eq!(
            with[at + 1..at + 4],
            ["/scratch/w", "--disk-bytes", "1048576"]
        );
        let without = words(&plan(false));
        assert!(without.contains(&"--no-namespaces".to_string()));
        assert!(!without.contains(&"--scratch".to_string()), "{without:?}");
        assert!(
            !without.contains(&"--disk-bytes".to_string()),
            "{without:?}"
        );
        assert!(without.contains(&"--seccomp".to_string()), "{without:?}");
    }
}

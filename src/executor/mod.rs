//! The one service every front end calls: validates requests, picks the
//! environment's pool, runs the code on a worker and shapes the result.
//!
//! * `start.rs`: finding and activating environments, starting their pools;
//! * `prepare.rs`: validating a request into a run (no worker involved);
//! * `run.rs`: running a prepared request on a worker and shaping its result;
//! * `sessions.rs`: starting and ending sessions.
//!
//! Package listing and installs live in [`crate::env::install`].

mod envs;
mod lifecycle;
mod pace;
mod prepare;
mod run;
mod sessions;
mod start;
mod text;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::api::{
    EnvInfo, EnvNetwork, Health, InstallRequest, InstallResult, PackageInfo, PoolSummary,
};
use crate::env::install::{EnvCommands, Installer, check_install, run_bounded};
use crate::error::{ExecError, PoolError};
use crate::limits::{RequestLimits, ResultLimits};
use crate::metrics::Metrics;
use crate::pool::WorkerBudget;
use crate::replica::Replica;
use crate::sandbox::SandboxStatus;
use crate::session::Sessions;
use envs::{EnvEntry, LiveEnvs};

/// A streaming run's output chunks, as front ends receive them.
pub use crate::worker::{OutputChunk, OutputSink, OutputStream};
pub use lifecycle::Progress;
pub use prepare::{PreparedRun, RunOptions, fixed_by_session};
pub use run::RunReport;
pub use start::WORKER_SCRIPT;
pub(crate) use text::{Output, OutputText};

/// Runs code in environments' worker pools.
pub struct Executor {
    /// The environments served now; follows the disk (see `envs.rs`).
    envs: Arc<LiveEnvs>,
    /// The `uv` installs with `manager: "uv"` (or `"auto"`) run: the
    /// configured one, else `uv` on the server's `PATH`.
    uv: Option<PathBuf>,
    /// The cap on live workers shared by all pools.
    budget: Arc<WorkerBudget>,
    /// Bound on one install run.
    install_timeout: Duration,
    /// Bound on one create or clone, all its steps together.
    create_timeout: Duration,
    /// Bound on running a new environment's activation scripts.
    activation_timeout: Duration,
    /// Creates and deletes run one at a time: a name is checked free and
    /// taken under it.
    create_lock: tokio::sync::Mutex<()>,
    max_output_bytes: u64,
    results: ResultLimits,
    /// Holds the bootstrap script and every worker's scratch root; removed
    /// when the executor is dropped.
    base_dir: tempfile::TempDir,
    next_id: AtomicU64,
    /// Set by `shutdown`: new requests are refused.
    closing: AtomicBool,
    /// What `GET /metrics` shows; shared with the front ends.
    metrics: Arc<Metrics>,
    /// Most test cases one grading request may carry.
    max_grade_cases: usize,
    /// What the sandbox enforces on this host, for `/health`.
    sandbox: SandboxStatus,
    /// Caps on a request's code and files.
    request_limits: RequestLimits,
    /// Live sessions, their caps and TTL reaper.
    sessions: Arc<Sessions>,
    /// Runs in flight, and whether one came after a pause (see `pace.rs`).
    pace: pace::Pace,
    /// The workers' cgroups, removed at shutdown.
    cgroups: Option<Arc<crate::sandbox::cgroup::CgroupRoot>>,
    /// This replica's id and whether it is draining (readiness off).
    replica: Arc<Replica>,
    /// MCP runs' artifacts, kept for `resources/read` and `GET /artifacts`.
    artifacts: Arc<crate::artifacts::ArtifactStore>,
    /// The audit log's queue (a no-op without `--audit-log`).
    audit: Arc<crate::audit::Audit>,
    /// The clients in force (reloaded on SIGHUP).
    clients: Arc<crate::auth::Clients>,
}

/// Why no worker could be had from an environment's pool, for the caller.
fn pool_refusal(entry: &EnvEntry, e: PoolError) -> ExecError {
    match e {
        PoolError::Busy(_) => ExecError::Busy(e),
        PoolError::Closed => ExecError::ShuttingDown,
        PoolError::Unavailable(reason) => ExecError::EnvUnavailable {
            env: entry.spec.name.clone(),
            reason,
        },
    }
}

impl Executor {
    /// The environment a request names (by name or prefix path), or the
    /// default one, among those served now.
    fn env_entry(&self, name: Option<&str>) -> Result<Arc<EnvEntry>, ExecError> {
        let table = self.envs.table();
        let known = || {
            let names: Vec<&str> = table.entries.iter().map(|e| e.spec.name.as_str()).collect();
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        };
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            // Still served unless `DELETE /envs` (with `force`) took it.
            if !table.entries.iter().any(|e| e.id == table.default.id) {
                return Err(ExecError::DefaultEnvDeleted {
                    name: table.default.spec.name.clone(),
                    known: known(),
                });
            }
            return Ok(table.default.clone());
        };
        if let Some(entry) = table.entries.iter().find(|e| e.spec.name == name) {
            return Ok(entry.clone());
        }
        if name.contains('/') {
            let wanted = Path::new(name)
                .canonicalize()
                .unwrap_or_else(|_| PathBuf::from(name));
            if let Some(entry) = table.entries.iter().find(|e| e.spec.prefix == wanted) {
                return Ok(entry.clone());
            }
        }
        Err(ExecError::UnknownEnv {
            name: name.to_string(),
            known: known(),
        })
    }

    /// The id of the environment `name` names (by name or prefix path), or
    /// of the default one: the same for every name of one environment.
    pub fn env_id(&self, name: Option<&str>) -> Result<usize, ExecError> {
        self.env_entry(name).map(|entry| entry.id)
    }

    /// Make sure the environment a request names is known: when it is not,
    /// discovery runs once more before the request is answered (an env
    /// created since the last scan is then served). Cheap when it is known.
    pub async fn find_env(&self, name: Option<&str>) {
        if let Some(name) = name.filter(|n| !n.is_empty())
            && matches!(
                self.env_entry(Some(name)),
                Err(ExecError::UnknownEnv { .. })
            )
        {
            self.envs.rescan_for_miss().await;
        }
    }

    /// The environment of a session, while it is served.
    fn session_entry(&self, id: usize) -> Result<Arc<EnvEntry>, ExecError> {
        self.envs
            .by_id(id)
            .ok_or_else(|| ExecError::EnvUnavailable {
                env: format!("#{id}"),
                reason: "the session's environment was removed".into(),
            })
    }

    /// Like [`Executor::env_entry`], refusing an environment that cannot
    /// run code.
    /// The caller's env allow-list is checked here, so every request that
    /// names an environment (runs, sessions, gradings, installs, package
    /// listings) is held to it.
    fn available_entry(&self, name: Option<&str>) -> Result<Arc<EnvEntry>, ExecError> {
        let entry = self.env_entry(name)?;
        if let Some(caller) = crate::auth::current()
            && let Err(err) = caller
                .client
                .require_env(&entry.spec.name, name.filter(|n| *n != entry.spec.name))
        {
            self.audit_refusal(&err, Some(&entry.spec.name));
            return Err(err);
        }
        match &entry.unavailable {
            Some(reason) => Err(ExecError::EnvUnavailable {
                env: entry.spec.name.clone(),
                reason: reason.clone(),
            }),
            None => Ok(entry),
        }
    }

    /// Every environment with its pool's counts.
    pub fn list_envs(&self) -> Vec<EnvInfo> {
        let table = self.envs.table();
        table
            .entries
            .iter()
            .map(|e| {
                let status = e.pool.status();
                EnvInfo {
                    name: e.spec.name.clone(),
                    prefix: e.spec.prefix.display().to_string(),
                    kind: e.spec.kind.as_str().into(),
                    python_version: e
                        .facts
                        .python_version
                        .clone()
                        .filter(|v| v.matches('.').count() >= 2)
                        .or_else(|| e.pool.python_version())
                        .or_else(|| e.facts.python_version.clone()),
                    platform: e.facts.platform.clone(),
                    env_hash: e.hash().to_string(),
                    default: e.id == table.default.id,
                    network: EnvNetwork {
                        mode: match (&e.egress, e.settings.network) {
                            (Some(_), _) => "allow_list",
                            (None, crate::config::Network::Host) => "host",
                            (None, crate::config::Network::Isolated) => "isolated",
                        },
                        allowed_hosts: e
                            .egress
                            .as_ref()
                            .map(|g| g.policy.entries())
                            .unwrap_or_default(),
                    },
                    pool: PoolSummary {
                        size: status.size,
                        idle: status.idle,
                        busy: status.busy,
                    },
                    error: e.unavailable.clone().or(status.error),
                }
            })
            .collect()
    }

    /// Warm workers the environment a request names keeps: how many runs of
    /// one request may go at once without queueing on each other.
    pub fn pool_size(&self, env: Option<&str>) -> Result<usize, ExecError> {
        Ok(self.available_entry(env)?.settings.pool_size.max(1))
    }

    /// Most test cases one grading request may carry.
    pub fn max_grade_cases(&self) -> usize {
        self.max_grade_cases
    }

    /// Name of the environment used when a request names none.
    pub fn default_env(&self) -> String {
        self.envs.table().default.spec.name.clone()
    }

    /// Workers alive now across all environments, and the cap.
    pub fn live_workers(&self) -> (usize, usize) {
        (self.budget.live(), self.budget.max())
    }

    /// Overall health: every environment's pool, the sandbox, the caps.
    pub fn health(&self) -> Health {
        let table = self.envs.table();
        let mut sandbox = self.sandbox.clone();
        if sandbox.disk_quota {
            // The environments served now: a rescan adds and removes some.
            sandbox.disk_bytes = table
                .entries
                .iter()
                .map(|e| (e.spec.name.clone(), e.settings.disk_bytes))
                .collect();
        }
        let envs: BTreeMap<_, _> = table
            .entries
            .iter()
            .map(|e| {
                let mut status = e.pool.status();
                if let Some(reason) = &e.unavailable {
                    status.error = Some(reason.clone());
                }
                (e.spec.name.clone(), status)
            })
            .collect();
        let serving = envs
            .values()
            .any(|s| s.size > 0 || s.starting > 0 || s.error.is_none());
        let draining = self.replica.is_draining() || self.closing.load(Ordering::Acquire);
        Health {
            status: match (draining, serving) {
                (true, _) => "draining",
                (false, true) => "ok",
                (false, false) => "unavailable",
            },
            replica: self.replica.id().to_string(),
            sessions: self.sessions.live(),
            envs,
            sandbox,
            request_limits: self.request_limits,
        }
    }

    /// Where this server listens: the egress proxies refuse these addresses
    /// unless an allow-list entry names the address and port.
    pub fn set_listen_addresses(&self, addrs: Vec<std::net::SocketAddr>) {
        crate::egress::add_server_addresses(addrs);
    }

    /// Start draining: `/health` answers 503 `draining` so that balancers
    /// stop sending, new sessions are refused (they would die with the
    /// replica), and everything else is still served.
    pub fn drain(&self) {
        self.replica.drain();
    }

    /// This replica's id and serving state.
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// Refuse new requests and terminate every idle worker. Workers still
    /// running a request are terminated when they are returned.
    pub async fn shutdown(&self) {
        self.closing.store(true, Ordering::Release);
        self.sessions.shutdown().await;
        self.audit.flush(std::time::Duration::from_secs(5)).await;
        self.envs.close();
        let table = self.envs.table();
        futures_util::future::join_all(table.entries.iter().map(|e| e.pool.close())).await;
        if let Some(cgroups) = self.cgroups.clone() {
            let _ = tokio::task::spawn_blocking(move || {
                cgroups.remove_all(std::time::Duration::from_secs(3))
            })
            .await;
        }
    }

    /// The store of MCP runs' artifacts.
    pub fn artifacts(&self) -> &crate::artifacts::ArtifactStore {
        &self.artifacts
    }

    /// The server's metrics (`GET /metrics`).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The audit log.
    pub fn audit(&self) -> &crate::audit::Audit {
        &self.audit
    }

    /// The clients in force.
    pub fn clients(&self) -> &crate::auth::Clients {
        &self.clients
    }

    /// SIGHUP: reopen the audit log and re-read the clients file. A clients
    /// file that cannot be used is logged and the clients in force stay.
    pub fn reload(&self) -> Result<usize, crate::error::ClientsError> {
        self.audit.reopen();
        let loaded = self.clients.reload();
        match &loaded {
            Ok(n) => tracing::info!(clients = n, "reloaded: audit log reopened, clients re-read"),
            Err(e) => tracing::error!(
                "clients file not reloaded, the clients in force stay: {}",
                crate::error::error_chain(e)
            ),
        }
        loaded
    }

    /// The audit record of a refusal the executor made for the caller's
    /// rights or quotas (403, 429); other refusals leave none.
    pub(crate) fn audit_refusal(&self, err: &ExecError, env: Option<&str>) {
        self.audit_refusal_as(crate::auth::current().as_deref(), err, env);
    }

    /// [`Executor::audit_refusal`] for `caller`.
    pub(crate) fn audit_refusal_as(
        &self,
        caller: Option<&crate::auth::Caller>,
        err: &ExecError,
        env: Option<&str>,
    ) {
        if !self.audit.enabled() {
            return;
        }
        let kind = match err {
            ExecError::Forbidden(_) => crate::audit::RecordKind::AuthFailure,
            ExecError::TooManyRequests { .. } | ExecError::TooManySessions { .. } => {
                crate::audit::RecordKind::RateLimited
            }
            _ => return,
        };
        let mut r = crate::audit::Record::new(kind, caller);
        {
            r.env = env.map(str::to_string);
            r.env_hash = self.audit_env_hash(env);
            r.outcome = Some("refused");
            r.status = Some(err.status());
            r.error = Some(err.code());
            r.message = Some(err.to_string());
        }
        self.audit.emit(r, None);
    }

    /// Write an audit record of `kind` for the current caller, built by
    /// `fill` (not called when there is no audit log).
    pub(crate) fn audit_record(
        &self,
        kind: crate::audit::RecordKind,
        fill: impl FnOnce(&mut crate::audit::Record),
    ) {
        if !self.audit.enabled() {
            return;
        }
        let caller = crate::auth::current();
        let mut record = crate::audit::Record::new(kind, caller.as_deref());
        fill(&mut record);
        // A create that failed names an environment it did not make (one
        // of that name may exist): its record has the hash of none.
        if record.env_hash.is_none() && kind != crate::audit::RecordKind::EnvCreate {
            record.env_hash = self.audit_env_hash(record.env.as_deref());
        }
        self.audit.emit(record, caller.as_deref());
    }

    /// The content hash of the served environment named `env`, for a
    /// record that names one.
    pub(crate) fn audit_env_hash(&self, env: Option<&str>) -> Option<String> {
        let entry = self.env_entry(Some(env.filter(|e| !e.is_empty())?)).ok()?;
        Some(entry.hash().to_string())
    }

    /// With `audit_fail = "closed"`: the current caller holds a reserved
    /// queue slot for each of the `n` records its request writes, or the
    /// request is refused (`503 audit_unavailable`) before anything runs.
    pub(crate) fn reserve_records(&self, n: usize) -> Result<(), ExecError> {
        match crate::auth::current() {
            Some(caller) => self.audit.reserve_records(&caller, n),
            None => Ok(()),
        }
    }

    /// Directory holding the bootstrap and the workers' scratch roots.
    pub fn base_dir(&self) -> &Path {
        self.base_dir.path()
    }
}

impl Executor {
    /// Where commands of `entry`'s environment run.
    fn commands<'a>(&'a self, entry: &'a EnvEntry) -> EnvCommands<'a> {
        EnvCommands {
            spec: &entry.spec,
            vars: &entry.vars,
            base_dir: self.base_dir.path(),
        }
    }

    /// Installed distributions of an environment (name, version), sorted by
    /// name: what `importlib.metadata` sees, plus the Conda packages of
    /// `conda-meta/` that are not Python distributions.
    pub async fn list_packages(&self, env: Option<&str>) -> Result<Vec<PackageInfo>, ExecError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ExecError::ShuttingDown);
        }
        self.find_env(env).await;
        let entry = self.available_entry(env)?;
        self.commands(&entry)
            .packages()
            .await
            .map_err(|reason| ExecError::EnvUnavailable {
                env: entry.spec.name.clone(),
                reason,
            })
    }

    /// Install packages into an environment with pip, uv or Conda. The
    /// request is checked first (an option, an invalid requirement, a
    /// relative or missing path refuses the whole request, nothing runs)
    /// and its items passed as argv items; the `requirements` text goes to
    /// a private file passed with `-r`. Installs into one env are
    /// serialized; runs keep using the current workers meanwhile, and after
    /// a successful install the env's workers are replaced once so the next
    /// run sees the new packages, and its `env_hash` is read again (with a
    /// Conda install, its activation too: see [`LiveEnvs::after_install`]).
    pub async fn install(&self, req: InstallRequest) -> Result<InstallResult, ExecError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ExecError::ShuttingDown);
        }
        check_install(&req)?;
        self.find_env(req.env.as_deref()).await;
        let entry = self.available_entry(req.env.as_deref())?;
        let conda = self.envs.conda();
        let tool = Installer::choose(req.manager, self.uv.as_deref(), conda.as_deref())?;
        let lock = entry.install_lock.clone();
        let serialized = lock.lock().await;
        // An install waited for may have had the environment read again:
        // this one runs with, and answers for, the entry serving it now.
        let entry = self.envs.by_id(entry.id).unwrap_or(entry);
        let commands = self.commands(&entry);
        let requirements = match &req.requirements {
            Some(text) => {
                let mut file = tempfile::Builder::new()
                    .prefix("requirements-")
                    .suffix(".txt")
                    .tempfile_in(self.base_dir.path())
                    .map_err(ExecError::Installer)?;
                std::io::Write::write_all(&mut file, text.as_bytes())
                    .map_err(ExecError::Installer)?;
                Some(file.into_temp_path())
            }
            None => None,
        };
        let cmd = commands.installer(&req, &tool, requirements.as_deref());
        let before = commands.packages().await.unwrap_or_default();
        tracing::info!(env = %entry.spec.name, manager = tool.name(), packages = ?req.packages, "installing");
        let out = run_bounded(cmd, self.install_timeout)
            .await
            .map_err(ExecError::Installer)?;
        drop(requirements);
        let mut installed = Vec::new();
        let done = out.exit_code == 0 && !out.timed_out;
        if done {
            let after = commands.packages().await.unwrap_or_default();
            installed = after
                .into_iter()
                .filter(|p| !before.contains(p))
                .map(|p| format!("{}=={}", p.name, p.version))
                .collect();
        }
        // Read again before the next install into it starts (it waits for
        // the lock): this one's answer and the runs after it see the
        // environment as it left it, and the next starts on that entry.
        let served = if done {
            self.envs.after_install(&entry).await
        } else {
            // Even a failed install may have changed something.
            entry.rehash();
            entry.clone()
        };
        drop(serialized);
        let env_hash = served.hash().to_string();
        self.audit_record(crate::audit::RecordKind::Install, |r| {
            r.env = Some(entry.spec.name.clone());
            r.env_hash = Some(env_hash.clone());
            r.packages = Some(req.packages.clone());
            r.outcome = Some(if out.timed_out {
                "timeout"
            } else if out.exit_code == 0 {
                "ok"
            } else {
                "error"
            });
            r.exit_code = Some(out.exit_code);
        });
        Ok(InstallResult {
            env: entry.spec.name.clone(),
            manager: tool.name().into(),
            exit_code: out.exit_code,
            stdout: out.stdout,
            stderr: out.stderr,
            installed,
            timed_out: out.timed_out,
            env_hash,
        })
    }
}

//! The one service every front end calls: validates requests, picks the
//! environment's pool, runs the code on a worker and shapes the result.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use serde::Serialize;

use std::os::unix::fs::PermissionsExt;

use crate::config::{Config, RequestLimits};
use crate::env::packages::{LIST_SCRIPT, check_conda_spec, check_pip_spec, conda_packages};
use crate::env::{EnvSettings, EnvSpec, Registry, activate::activate};
use crate::error::{ExecError, PoolError, WorkerError};
use crate::metrics::{EnvMetrics, Metrics, RunOutcome};
use crate::pool::{EnvPool, PoolConfig, PoolStatus, RestartCause, WorkerBudget, error_chain};
use crate::protocol::{self, ExecFrame, FileEntry, RunLimits, SessionFrame, WireSelection};
use crate::replica::Replica;
use crate::sandbox::{Sandbox, SandboxStatus};
use crate::session::{ActiveCall, CreateSessionRequest, SessionInfo, Sessions};
use crate::types::{
    Artifact, ArtifactSelection, ExecRequest, ExecResult, InstallRequest, InstallResult,
    PackageInfo, PackageManager, RunError, check_file_path,
};
use crate::worker::{OutputSink, WorkerSpec, kill_process_tree, worker_env};

/// The bootstrap every worker runs, embedded in the binary.
pub const WORKER_SCRIPT: &str = include_str!("../python/worker.py");

/// Extra time the server grants a worker beyond the run's own timeout before
/// it declares the worker unresponsive and kills it.
const HARD_DEADLINE_SLACK: Duration = Duration::from_secs(3);
/// Remove what servers killed without a chance to clean up (SIGKILL, a
/// crash) left in `tmp`: their bootstrap and workers' scratch roots. Only
/// directories of this pid namespace's servers that are gone are touched.
fn remove_stale_base_dirs(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let stale = entry
            .file_name()
            .to_str()
            .is_some_and(crate::sandbox::cgroup::is_stale_server_dir);
        if stale && entry.file_type().is_ok_and(|t| t.is_dir()) {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => {
                    tracing::info!(dir = %entry.path().display(), "removed the temporary directory of a server that is gone")
                }
                Err(e) => {
                    tracing::warn!(dir = %entry.path().display(), "cannot remove the temporary directory of a server that is gone: {e}")
                }
            }
        }
    }
}

/// `seconds` (positive and finite) as a duration, at most `max`: checked
/// before converting, since `Duration::from_secs_f64` panics past `u64`.
pub(crate) fn capped_secs(seconds: f64, max: Duration) -> Duration {
    if seconds >= max.as_secs_f64() {
        max
    } else {
        Duration::from_secs_f64(seconds)
    }
}

/// Workers a request may try when each in turn refuses it for a scratch
/// root it could not clear (see `WorkerError::Retired`).
const RETIRED_RETRIES: u32 = 3;

/// Bound on listing an environment's packages.
const LIST_PACKAGES_TIMEOUT: Duration = Duration::from_secs(60);

/// Output kept per stream of an install run.
const INSTALL_OUTPUT_LIMIT: usize = 1 << 20;

/// Variables of the server's environment an install may see besides the
/// env's activation: proxies and index settings an operator sets for
/// installs. Tokens never are.
const INSTALL_VARS: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_CERT",
    "CONDA_PKGS_DIRS",
    "CONDARC",
];

/// A validated request, encoded and bound to its environment.
pub struct PreparedRun {
    /// Index of the environment in the executor's list.
    env: usize,
    frame: Vec<u8>,
    timeout: f64,
    /// The address-space limit the run gets (configured, narrowed by the
    /// request), to tell a run that hit it.
    memory_bytes: Option<u64>,
    /// The session the run belongs to, held active (it cannot expire)
    /// until the run ends.
    session: Option<ActiveCall>,
    /// The run's `processes`, for the worker's pids cgroup, when the
    /// request lowered it.
    processes: Option<u64>,
}

impl PreparedRun {
    /// The effective wall-clock limit of the run, seconds.
    pub fn timeout(&self) -> f64 {
        self.timeout
    }

    /// The effective address-space limit of the run, bytes.
    pub fn memory_bytes(&self) -> Option<u64> {
        self.memory_bytes
    }
}

/// What a caller inside the crate may add to a request's run beyond what
/// [`ExecRequest`] carries (grading uses both).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// `sys.argv[1:]` of the run.
    pub argv: Vec<String>,
    /// Reap the run before answering and report its CPU time and peak RSS.
    pub rusage: bool,
    /// Caps on the artifacts' content in place of the server's
    /// `max_artifact_bytes` / `max_artifacts_bytes` (MCP keeps artifacts in
    /// its store, so it takes larger ones).
    pub artifacts: Option<ResultLimits>,
    /// Plots are saved at a resolution of at most this many pixels.
    pub max_image_pixels: Option<u64>,
}

/// Caps on what a run returns besides its output.
#[derive(Debug, Clone, Copy)]
pub struct ResultLimits {
    /// Largest single artifact returned with its content.
    pub max_artifact_bytes: u64,
    /// Content of all artifacts of one run together.
    pub max_artifacts_bytes: u64,
    /// Longest `result` repr before it is cut.
    pub max_result_chars: u64,
}

/// One environment and its pool.
struct EnvEntry {
    spec: EnvSpec,
    settings: EnvSettings,
    pool: EnvPool,
    /// Why the environment cannot serve (its activation failed), if so.
    unavailable: Option<String>,
    /// The activated environment (scripts included) workers, package
    /// listings and installs run with; built from scratch.
    vars: HashMap<String, String>,
    /// Installs into one environment run one at a time.
    install_lock: tokio::sync::Mutex<()>,
    /// This environment's run counters and histograms, resolved once.
    metrics: EnvMetrics,
}

/// An environment as `/list-envs` and MCP `list_environments` show it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema, utoipa::ToSchema)]
pub struct EnvInfo {
    pub name: String,
    pub prefix: String,
    pub kind: String,
    pub python_version: Option<String>,
    pub default: bool,
    pub pool: PoolSummary,
    /// Why the environment cannot run code (absent when it can).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Pool counts of one environment.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema, utoipa::ToSchema)]
pub struct PoolSummary {
    pub size: usize,
    pub idle: usize,
    pub busy: usize,
}

/// Overall health: `ok` while at least one environment can serve.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok`, `unavailable` (no environment can serve) or `draining` (the
    /// replica is stopping: it serves what still reaches it, and asks
    /// balancers to send nothing more).
    pub status: &'static str,
    /// This replica's id (`--replica-id`, default the host name): the
    /// replica that answered, and the one its sessions live on.
    pub replica: String,
    /// Live sessions on this replica.
    pub sessions: usize,
    pub envs: BTreeMap<String, PoolStatus>,
    /// Which confinement mechanisms are enforced (never any secret).
    pub sandbox: SandboxStatus,
    /// Caps on a request's code and files (413 above them).
    pub request_limits: RequestLimits,
}

/// Runs code in environments' worker pools.
pub struct Executor {
    envs: Vec<EnvEntry>,
    /// Index into `envs` of the environment used when a request names none.
    default: usize,
    /// The Conda front end `manager: "conda"` installs run.
    conda: Option<PathBuf>,
    /// The cap on live workers shared by all pools.
    budget: Arc<WorkerBudget>,
    /// Bound on one install run.
    install_timeout: Duration,
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
    /// The workers' cgroups, removed at shutdown.
    cgroups: Option<Arc<crate::sandbox::cgroup::CgroupRoot>>,
    /// This replica's id and whether it is draining (readiness off).
    replica: Arc<Replica>,
    /// MCP runs' artifacts, kept for `resources/read` and `GET /artifacts`.
    artifacts: Arc<crate::artifacts::ArtifactStore>,
}

impl Executor {
    /// Find the environments, activate each once, start the pools of the
    /// configured ones and wait until they are warm. Discovered environments
    /// start their pools on first use. Fails only when the default
    /// environment cannot start a worker.
    pub async fn start(config: &Config) -> anyhow::Result<Executor> {
        Self::start_with(config, true).await
    }

    /// [`Executor::start`] that returns before the pools are warm: they
    /// fill in the background, and a request meanwhile waits for its pool's
    /// first worker. What a client that starts its server per session (MCP
    /// over stdio) waits for is then one worker's start, not the whole pool's.
    pub async fn start_warming(config: &Config) -> anyhow::Result<Executor> {
        Self::start_with(config, false).await
    }

    async fn start_with(config: &Config, wait_for_warm: bool) -> anyhow::Result<Executor> {
        let registry = Registry::build(config).await?;
        let networks: Vec<_> = registry.envs.iter().map(|p| p.settings.network).collect();
        let sandbox = Sandbox::probe(&config.sandbox, &networks).await?;
        remove_stale_base_dirs(&std::env::temp_dir());
        let base_dir = tempfile::Builder::new()
            .prefix(&format!(
                "{}.",
                crate::sandbox::cgroup::own_server_dir_name()
            ))
            .tempdir()?;
        if sandbox.as_ref().and_then(Sandbox::owner).is_some() {
            // Workers running as another user must reach their scratch roots
            // (each is theirs alone) and read the bootstrap.
            std::fs::set_permissions(base_dir.path(), std::fs::Permissions::from_mode(0o711))?;
        }
        let script = match &config.worker_script {
            Some(path) => path.clone(),
            None => {
                let path = base_dir.path().join("worker.py");
                std::fs::write(&path, WORKER_SCRIPT)?;
                path
            }
        };
        let budget = WorkerBudget::new(config.max_workers);
        let activations = futures_util::future::join_all(registry.envs.iter().map(|plan| {
            activate(
                &plan.spec.prefix,
                &plan.spec.activation,
                config.activation_timeout,
            )
        }))
        .await;
        let mut envs = Vec::with_capacity(registry.envs.len());
        let mut pending = Vec::with_capacity(registry.envs.len());
        for (plan, activation) in registry.envs.into_iter().zip(activations) {
            let (vars, unavailable) = match activation {
                Ok(vars) => (vars, None),
                Err(reason) => {
                    tracing::error!(env = %plan.spec.name, "environment unavailable: {reason}");
                    (plan.spec.activation.clone(), Some(reason))
                }
            };
            let pool = EnvPool::with_budget(
                WorkerSpec {
                    python: plan.spec.python.clone(),
                    script: script.clone(),
                    scratch_parent: base_dir.path().to_path_buf(),
                    env: worker_env(&vars),
                    preload: plan.settings.preload.clone(),
                    start_timeout: config.worker_start_timeout,
                    grace_period: config.grace_period,
                    sandbox: sandbox.as_ref().map(|s| {
                        let mut wrap = s.plan(
                            plan.settings.network,
                            plan.settings.disk_bytes,
                            &plan.spec.python,
                        );
                        wrap.read.push(match &config.worker_script {
                            // A replacement bootstrap may import its neighbours.
                            Some(_) => script.parent().unwrap_or(&script).to_path_buf(),
                            None => script.clone(),
                        });
                        wrap.read.push(plan.spec.prefix.clone());
                        wrap
                    }),
                    owner: sandbox.as_ref().and_then(Sandbox::owner),
                    run_processes: plan
                        .settings
                        .run_limits
                        .processes
                        .unwrap_or(DEFAULT_PROCESSES),
                    memory_max: plan.settings.run_limits.memory_bytes.map(|m| {
                        // The scratch tmpfs is memory too, charged to
                        // the writer's cgroup.
                        m.saturating_add(WORKER_MEMORY)
                            .saturating_add(plan.settings.disk_bytes)
                    }),
                },
                PoolConfig {
                    size: plan.settings.pool_size,
                    queue_timeout: config.queue_timeout,
                    max_runs: config.max_runs,
                },
                budget.clone(),
                plan.configured,
            );
            pending.push((plan, pool, unavailable, vars));
        }
        let replica = Arc::new(Replica::new(config.replica_id.clone()));
        let sessions = Sessions::start(config.sessions.clone(), config.grace_period, replica.id());
        let metrics = Arc::new(
            Metrics::new(
                pending
                    .iter()
                    .map(|(plan, pool, ..)| (plan.spec.name.clone(), pool.clone()))
                    .collect(),
            )
            .with_replica(replica.clone(), sessions.clone()),
        );
        for (plan, pool, unavailable, vars) in pending {
            envs.push(EnvEntry {
                metrics: metrics.env(&plan.spec.name),
                spec: plan.spec,
                settings: plan.settings,
                pool,
                unavailable,
                vars,
                install_lock: tokio::sync::Mutex::new(()),
            });
        }
        let warm: Vec<&EnvEntry> = envs
            .iter()
            .filter(|e| e.pool.keeps_warm() && e.unavailable.is_none())
            .collect();
        for e in &warm {
            tracing::info!(
                env = %e.spec.name,
                python = %e.spec.python.display(),
                workers = e.settings.pool_size,
                "starting worker pool"
            );
        }
        if !wait_for_warm {
            // Serve at once (an MCP client waits for `initialize`); each
            // pool fills in the background, and the first request waits for
            // its first worker, not for all of them.
            for e in &warm {
                let (pool, name) = (e.pool.clone(), e.spec.name.clone());
                tokio::spawn(async move {
                    // One worker first, alone on the CPU (starting them all
                    // at once would make the first call wait for the
                    // slowest of them to share the cores), then the rest.
                    if let Ok(first) = pool.get().await {
                        pool.put(first);
                    }
                    if let Err(err) = pool.prewarm().await {
                        tracing::error!(
                            "environment {name:?} cannot start workers: {}",
                            error_chain(&err)
                        );
                    }
                });
            }
        }
        let prewarm = warm
            .iter()
            .filter(|_| wait_for_warm)
            .map(|e| e.pool.prewarm());
        let results = futures_util::future::join_all(prewarm).await;
        for (e, result) in warm.iter().zip(results) {
            if let Err(err) = result {
                let message = format!(
                    "environment {:?} cannot start workers: {}",
                    e.spec.name,
                    error_chain(&err)
                );
                if std::ptr::eq(*e, &envs[registry.default]) {
                    anyhow::bail!(message);
                }
                tracing::error!("{message}");
            }
        }
        let lazy: Vec<EnvPool> = envs
            .iter()
            .filter(|e| !e.pool.keeps_warm())
            .map(|e| e.pool.clone())
            .collect();
        for e in envs.iter().filter(|e| !e.pool.keeps_warm()) {
            tracing::info!(env = %e.spec.name, prefix = %e.spec.prefix.display(), "environment found; its workers start on first use");
        }
        if !lazy.is_empty() {
            tokio::spawn(shrink_idle_pools(lazy, config.idle_timeout));
        }
        let cgroups = sandbox.as_ref().and_then(Sandbox::cgroups);
        let sandbox = sandbox_status(sandbox.as_ref(), &envs);
        Ok(Executor {
            envs,
            default: registry.default,
            conda: registry.conda,
            budget,
            install_timeout: config.install_timeout,
            max_output_bytes: config.max_output_bytes,
            results: config.results,
            base_dir,
            next_id: AtomicU64::new(1),
            closing: AtomicBool::new(false),
            metrics,
            max_grade_cases: config.max_grade_cases,
            sandbox,
            request_limits: config.request_limits,
            artifacts: Arc::new(crate::artifacts::ArtifactStore::new(config.artifacts)),
            sessions,
            cgroups,
            replica,
        })
    }

    /// Run one request to completion.
    pub async fn execute(&self, req: ExecRequest) -> Result<ExecResult, ExecError> {
        let prepared = self.prepare(&req)?;
        self.run(prepared, None).await
    }

    /// Validate a request and encode its frame; every refusal of a request
    /// happens here, before any worker is involved.
    pub fn prepare(&self, req: &ExecRequest) -> Result<PreparedRun, ExecError> {
        self.prepare_with(req, &RunOptions::default())
    }

    /// [`Executor::prepare`] with extra run options.
    pub fn prepare_with(
        &self,
        req: &ExecRequest,
        options: &RunOptions,
    ) -> Result<PreparedRun, ExecError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ExecError::ShuttingDown);
        }
        let session = match &req.session {
            Some(id) => Some(self.session_call(id, req)?),
            None => None,
        };
        let entry = match &session {
            Some(call) => &self.envs[call.session().env()],
            None => self.available_entry(req.env.as_deref())?,
        };
        let timeout = match req.timeout {
            None => session
                .as_ref()
                .map_or(entry.settings.timeout, |c| c.session().timeout()),
            Some(t) if t.is_finite() && t > 0.0 => t.min(entry.settings.max_timeout),
            Some(t) => {
                return Err(ExecError::BadRequest(format!(
                    "timeout must be a positive number of seconds, got {t}"
                )));
            }
        };
        if let Some(digits @ 1..640) = req.int_max_str_digits {
            return Err(ExecError::BadRequest(format!(
                "int_max_str_digits must be 0 (no limit) or at least 640, got {digits}"
            )));
        }
        let limits = &self.request_limits;
        if req.code.len() > limits.max_code_bytes {
            return Err(ExecError::TooLarge(format!(
                "code is {} bytes, over the max_code_bytes limit of {}",
                req.code.len(),
                limits.max_code_bytes
            )));
        }
        let count = req.files.as_ref().map_or(0, |f| f.len());
        if count > limits.max_files {
            return Err(ExecError::TooLarge(format!(
                "{count} files, over the max_files limit of {}",
                limits.max_files
            )));
        }
        let mut contents = Vec::new();
        let mut total = 0usize;
        for (path, content) in req.files.iter().flatten() {
            check_file_path(path).map_err(ExecError::BadRequest)?;
            let bytes = content
                .to_bytes()
                .map_err(|e| ExecError::BadRequest(format!("file {path:?}: {e}")))?;
            total += bytes.len();
            if total > limits.max_files_bytes {
                return Err(ExecError::TooLarge(format!(
                    "files total over the max_files_bytes limit of {} bytes",
                    limits.max_files_bytes
                )));
            }
            contents.push((path.as_str(), bytes));
        }
        crate::types::check_file_set(contents.iter().map(|(p, _)| *p))
            .map_err(ExecError::BadRequest)?;
        // Files that cannot fit in the worker's scratch tmpfs never could.
        if self.sandbox.disk_quota && total as u64 > entry.settings.disk_bytes {
            return Err(ExecError::TooLarge(format!(
                "files total {total} bytes, over the disk_bytes quota of {} bytes",
                entry.settings.disk_bytes
            )));
        }
        let artifacts = match &req.artifacts {
            None => WireSelection::All(true),
            Some(ArtifactSelection::All(all)) => WireSelection::All(*all),
            Some(ArtifactSelection::Globs(globs)) => {
                if globs.iter().any(|g| g.is_empty()) {
                    return Err(ExecError::BadRequest(
                        "artifact globs must not be empty".into(),
                    ));
                }
                WireSelection::Globs(globs)
            }
        };
        let mut run = entry.settings.run_limits.clone();
        run.cpu_seconds.get_or_insert(timeout.ceil() as u64 + 1);
        if let Some(asked) = &req.limits {
            run = narrow_limits(&run, asked)?;
        }
        run.disk_bytes = self.run_disk_bytes(entry, run.disk_bytes)?;
        if let Some(disk) = run.disk_bytes
            && total as u64 > disk
        {
            // The run's files count against its own limit as well.
            return Err(ExecError::TooLarge(format!(
                "files total {total} bytes, over the request's limits.disk_bytes of {disk} bytes"
            )));
        }
        let frame = protocol::encode_frame(&ExecFrame {
            t: "exec",
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            code: &req.code,
            stdin: req.stdin.as_deref().map(str::as_bytes),
            files: contents
                .iter()
                .map(|(p, b)| FileEntry(p, b.as_slice()))
                .collect(),
            argv: &options.argv,
            timeout,
            max_output: self.max_output_bytes,
            limits: &run,
            stream: req.stream.unwrap_or(false),
            artifacts,
            max_artifact_bytes: options
                .artifacts
                .map_or(self.results.max_artifact_bytes, |a| a.max_artifact_bytes),
            max_artifacts_bytes: options
                .artifacts
                .map_or(self.results.max_artifacts_bytes, |a| a.max_artifacts_bytes),
            max_image_pixels: options.max_image_pixels,
            max_result_chars: self.results.max_result_chars,
            rusage: options.rusage,
            int_max_str_digits: req.int_max_str_digits,
        })
        .map_err(|e| ExecError::BadRequest(format!("request cannot be encoded: {e}")))?;
        Ok(PreparedRun {
            env: self
                .envs
                .iter()
                .position(|e| std::ptr::eq(e, entry))
                .expect("the entry is one of ours"),
            frame,
            timeout,
            memory_bytes: run.memory_bytes,
            session,
            processes: req
                .limits
                .as_ref()
                .and_then(|l| l.processes)
                .and(run.processes),
        })
    }

    /// A run's `limits.disk_bytes`: watched by the worker below the size of
    /// its scratch tmpfs (which caps every run anyway); refused where there is
    /// no such tmpfs, since usage could not be told from other files there.
    fn run_disk_bytes(
        &self,
        entry: &EnvEntry,
        asked: Option<u64>,
    ) -> Result<Option<u64>, ExecError> {
        let Some(asked) = asked else {
            return Ok(None);
        };
        if !self.sandbox.disk_quota {
            return Err(ExecError::BadRequest(
                "limits.disk_bytes needs the workers' scratch tmpfs, which this server does not have (see /health sandbox.disk_quota)".into(),
            ));
        }
        Ok((asked < entry.settings.disk_bytes).then_some(asked))
    }

    /// The session a request names, checked against the rest of the
    /// request; it stays active (cannot expire) while the call lives.
    fn session_call(&self, id: &str, req: &ExecRequest) -> Result<ActiveCall, ExecError> {
        let call = self.sessions.begin(id)?;
        let env = &self.envs[call.session().env()];
        if let Some(name) = req.env.as_deref().filter(|n| !n.is_empty()) {
            let asked = self.env_entry(Some(name))?;
            if !std::ptr::eq(asked, env) {
                return Err(ExecError::BadRequest(format!(
                    "session {id:?} runs in environment {:?}, not {name:?}; omit env or create a session in {name:?}",
                    env.spec.name
                )));
            }
        }
        if req.limits.is_some() {
            return Err(ExecError::BadRequest(
                "a session's limits are set when it is created (POST /sessions with limits); a call cannot change them".into(),
            ));
        }
        Ok(call)
    }

    /// Run a prepared request on a worker of its environment. With `output`,
    /// the worker streams output chunks there while the run goes on.
    /// Dropping the returned future kills the run.
    pub async fn run(
        &self,
        prepared: PreparedRun,
        output: Option<OutputSink>,
    ) -> Result<ExecResult, ExecError> {
        self.run_output(prepared, output).await.map(shape_result)
    }

    /// [`Executor::run`], returning the worker's report as it came.
    pub async fn run_output(
        &self,
        prepared: PreparedRun,
        output: Option<OutputSink>,
    ) -> Result<crate::worker::RunOutput, ExecError> {
        let PreparedRun {
            env,
            frame,
            timeout,
            session,
            processes,
            ..
        } = prepared;
        let entry = &self.envs[env];
        if let Some(call) = session {
            let deadline = Duration::from_secs_f64(timeout)
                + self.sessions.config().interrupt_grace
                + HARD_DEADLINE_SLACK;
            return self
                .sessions
                .execute(call, &frame, deadline, output.as_ref())
                .await;
        }
        let env_name = entry.spec.name.as_str();
        // A worker that ran nothing because its scratch root stayed dirty
        // hands the request on: the next worker runs it.
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self
                .run_on_pool(entry, &frame, timeout, processes, output.as_ref())
                .await
            {
                Err(ExecError::Worker(WorkerError::Retired(why))) if attempts < RETIRED_RETRIES => {
                    tracing::info!(
                        env = env_name,
                        "worker retired before the run ({why}); running it on another"
                    );
                }
                other => return other,
            }
        }
    }

    /// One attempt of [`Executor::run_output`] on a worker of `entry`'s pool.
    async fn run_on_pool(
        &self,
        entry: &EnvEntry,
        frame: &[u8],
        timeout: f64,
        processes: Option<u64>,
        output: Option<&OutputSink>,
    ) -> Result<crate::worker::RunOutput, ExecError> {
        let env_name = entry.spec.name.as_str();
        let queued = Instant::now();
        let got = entry.pool.get().await;
        entry.metrics.queue_wait(queued.elapsed().as_secs_f64());
        let worker = got.map_err(|e| {
            let outcome = match e {
                PoolError::Busy(_) => RunOutcome::Busy,
                PoolError::Closed | PoolError::Unavailable(_) => RunOutcome::Failed,
            };
            entry.metrics.outcome(outcome);
            tracing::info!(env = env_name, %outcome, "run refused: {e}");
            pool_refusal(entry, e)
        })?;
        let worker_pid = worker.pid();
        let mut in_flight = InFlight {
            worker: Some(worker),
            pool: &entry.pool,
            restore_processes: processes.is_some(),
        };
        let worker = in_flight.worker.as_mut().expect("set above");
        if processes.is_some()
            && let Err(e) = worker.set_run_processes(processes)
        {
            entry.pool.discard(in_flight.take(), RestartCause::Crash);
            return Err(ExecError::Internal(format!(
                "cannot cap the run's processes in the worker's cgroup: {e}"
            )));
        }
        let started = Instant::now();
        let deadline = Duration::from_secs_f64(timeout) + HARD_DEADLINE_SLACK;
        let ran = worker.execute_cancellable(frame, deadline, output).await;
        let mut worker = in_flight.take();
        let seconds = started.elapsed().as_secs_f64();
        match ran {
            Ok(out) => {
                if processes.is_some()
                    && let Err(e) = worker.set_run_processes(None)
                {
                    // It would cap the next runs too low: replace it.
                    tracing::warn!(worker_pid, "cannot restore the worker's pids.max: {e}");
                    entry.pool.discard(worker, RestartCause::Crash);
                } else {
                    entry.pool.put(worker);
                }
                let outcome = RunOutcome::of(&out);
                entry.metrics.run(outcome, seconds);
                // One line per run; never the code or its output.
                tracing::info!(
                    env = env_name,
                    %outcome,
                    duration_ms = (seconds * 1e6).round() / 1e3,
                    exit_code = out.exit_code,
                    worker_pid,
                    "run finished"
                );
                Ok(out)
            }
            Err(WorkerError::Retired(why)) => {
                entry.pool.discard(worker, RestartCause::Dirty);
                Err(ExecError::Worker(WorkerError::Retired(why)))
            }
            Err(e) => {
                let cause = match e {
                    WorkerError::Unresponsive(_) => RestartCause::Timeout,
                    _ => RestartCause::Crash,
                };
                entry.metrics.run(RunOutcome::Failed, seconds);
                tracing::warn!(
                    env = env_name,
                    outcome = %RunOutcome::Failed,
                    duration_ms = (seconds * 1e6).round() / 1e3,
                    worker_pid,
                    "run failed, discarding worker: {}",
                    error_chain(&e)
                );
                entry.pool.discard(worker, cause);
                Err(ExecError::Worker(e))
            }
        }
    }

    /// Start a session: a warm worker of the environment leaves its pool
    /// (which refills) and forks the session's process.
    pub async fn create_session(
        &self,
        req: CreateSessionRequest,
    ) -> Result<SessionInfo, ExecError> {
        if self.closing.load(Ordering::Acquire) || self.replica.is_draining() {
            // A session made now would end with this replica in seconds:
            // the client retries (503), and the balancer sends it elsewhere.
            return Err(ExecError::Draining(format!(
                "replica {:?} is draining (shutting down) and starts no new session; retry: \
                 another replica will take it",
                self.replica.id()
            )));
        }
        let config = self.sessions.config();
        let entry = self.available_entry(req.env.as_deref())?;
        let index = self.index_of(entry);
        let ttl = match req.ttl {
            None => config.ttl,
            Some(t) if t.is_finite() && t > 0.0 => capped_secs(t, config.max_ttl),
            Some(t) => {
                return Err(ExecError::BadRequest(format!(
                    "ttl must be a positive number of seconds, got {t}"
                )));
            }
        };
        let timeout = match req.timeout {
            None => entry.settings.timeout,
            Some(t) if t.is_finite() && t > 0.0 => t.min(entry.settings.max_timeout),
            Some(t) => {
                return Err(ExecError::BadRequest(format!(
                    "timeout must be a positive number of seconds, got {t}"
                )));
            }
        };
        let mut limits = entry.settings.run_limits.clone();
        if let Some(asked) = &req.limits {
            limits = narrow_limits(&limits, asked)?;
        }
        if limits.disk_bytes.is_some() {
            return Err(ExecError::BadRequest(format!(
                "limits.disk_bytes applies to single runs; a session's files are capped by the \
                 environment's disk_bytes ({} bytes)",
                entry.settings.disk_bytes
            )));
        }
        let reservation = self.sessions.reserve(index, &entry.spec.name)?;
        // The worker serves this session alone from now on: a lower
        // `processes` stays in its cgroup for the session's life.
        let processes = req
            .limits
            .as_ref()
            .and_then(|l| l.processes)
            .and(limits.processes);
        let frame = protocol::encode_frame(&SessionFrame {
            t: "session",
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            limits: &limits,
            grace: config.interrupt_grace.as_secs_f64(),
        })
        .map_err(|e| ExecError::Internal(format!("session frame cannot be encoded: {e}")))?;
        let mut attempts = 0;
        let worker = loop {
            attempts += 1;
            let worker = entry.pool.get().await.map_err(|e| pool_refusal(entry, e))?;
            let mut worker = entry.pool.detach(worker);
            if let Err(e) = worker.set_run_processes(processes) {
                tokio::spawn(worker.terminate(self.sessions.grace()));
                return Err(ExecError::Internal(format!(
                    "cannot cap the session's processes in its worker's cgroup: {e}"
                )));
            }
            match worker.execute(&frame, HARD_DEADLINE_SLACK, None).await {
                Ok(_) => break worker,
                Err(e) => {
                    tokio::spawn(worker.terminate(self.sessions.grace()));
                    if matches!(e, WorkerError::Retired(_)) && attempts < RETIRED_RETRIES {
                        continue;
                    }
                    tracing::warn!(env = %entry.spec.name, "session failed to start: {}", error_chain(&e));
                    return Err(ExecError::Worker(e));
                }
            }
        };
        self.sessions
            .insert(reservation, entry.spec.name.clone(), ttl, timeout, worker)
    }

    /// Whether session `id` is live (it may still end before its next call).
    pub fn has_session(&self, id: &str) -> bool {
        self.sessions.contains(id)
    }

    /// Every live session, oldest first.
    pub fn list_sessions(&self) -> Vec<SessionInfo> {
        self.sessions.list()
    }

    /// End a session: later calls get `unknown_session`; calls already
    /// accepted finish first.
    pub fn close_session(&self, id: &str) -> Result<SessionInfo, ExecError> {
        self.sessions.close(id)
    }

    fn index_of(&self, entry: &EnvEntry) -> usize {
        self.envs
            .iter()
            .position(|e| std::ptr::eq(e, entry))
            .expect("the entry is one of ours")
    }

    /// The environment a request names (by name or prefix path), or the
    /// default one.
    fn env_entry(&self, name: Option<&str>) -> Result<&EnvEntry, ExecError> {
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return Ok(&self.envs[self.default]);
        };
        if let Some(entry) = self.envs.iter().find(|e| e.spec.name == name) {
            return Ok(entry);
        }
        if name.contains('/') {
            let wanted = Path::new(name)
                .canonicalize()
                .unwrap_or_else(|_| PathBuf::from(name));
            if let Some(entry) = self.envs.iter().find(|e| e.spec.prefix == wanted) {
                return Ok(entry);
            }
        }
        Err(ExecError::UnknownEnv {
            name: name.to_string(),
            known: self
                .envs
                .iter()
                .map(|e| e.spec.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// Like [`Executor::env_entry`], refusing an environment that cannot
    /// run code.
    fn available_entry(&self, name: Option<&str>) -> Result<&EnvEntry, ExecError> {
        let entry = self.env_entry(name)?;
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
        self.envs
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let status = e.pool.status();
                EnvInfo {
                    name: e.spec.name.clone(),
                    prefix: e.spec.prefix.display().to_string(),
                    kind: e.spec.kind.as_str().into(),
                    python_version: e
                        .pool
                        .python_version()
                        .or_else(|| e.spec.python_version_hint()),
                    default: i == self.default,
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
    pub fn default_env(&self) -> &str {
        &self.envs[self.default].spec.name
    }

    /// Workers alive now across all environments, and the cap.
    pub fn live_workers(&self) -> (usize, usize) {
        (self.budget.live(), self.budget.max())
    }

    /// Installed distributions of an environment (name, version), sorted by
    /// name: what `importlib.metadata` sees, plus the Conda packages of
    /// `conda-meta/` that are not Python distributions. Runs the env's
    /// interpreter with a fixed script; no shell.
    pub async fn list_packages(&self, env: Option<&str>) -> Result<Vec<PackageInfo>, ExecError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ExecError::ShuttingDown);
        }
        let entry = self.available_entry(env)?;
        self.packages_of(entry).await
    }

    async fn packages_of(&self, entry: &EnvEntry) -> Result<Vec<PackageInfo>, ExecError> {
        let unavailable = |reason: String| ExecError::EnvUnavailable {
            env: entry.spec.name.clone(),
            reason,
        };
        let mut cmd = self.command_in(entry, &entry.spec.python);
        cmd.args(["-I", "-c", LIST_SCRIPT]);
        let out = run_bounded(cmd, LIST_PACKAGES_TIMEOUT)
            .await
            .map_err(|e| unavailable(format!("cannot list packages: {e}")))?;
        if out.exit_code != 0 {
            return Err(unavailable(format!(
                "listing packages failed: {}",
                out.stderr.trim()
            )));
        }
        let pairs: Vec<(String, String)> = serde_json::from_str(&out.stdout)
            .map_err(|e| unavailable(format!("unreadable package list: {e}")))?;
        let normal = |n: &str| n.to_ascii_lowercase().replace('_', "-");
        let mut packages: BTreeMap<String, PackageInfo> = pairs
            .into_iter()
            .map(|(name, version)| (normal(&name), PackageInfo { name, version }))
            .collect();
        for (name, version) in conda_packages(&entry.spec.prefix) {
            packages
                .entry(normal(&name))
                .or_insert(PackageInfo { name, version });
        }
        Ok(packages.into_values().collect())
    }

    /// Install packages into an environment with pip or Conda. Specs are
    /// checked first (an option or an invalid requirement refuses the whole
    /// request, nothing runs) and passed as argv items. Installs into one
    /// env are serialized; runs keep using the current workers meanwhile,
    /// and after a successful install the env's workers are replaced so the
    /// next run sees the new packages.
    pub async fn install(&self, req: InstallRequest) -> Result<InstallResult, ExecError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ExecError::ShuttingDown);
        }
        if req.packages.is_empty() {
            return Err(ExecError::BadRequest(
                "packages must name at least one package".into(),
            ));
        }
        for spec in &req.packages {
            let checked = if spec.trim_start().starts_with('-') {
                Err("options are not accepted, only package requirements".to_string())
            } else {
                match req.manager {
                    PackageManager::Pip => check_pip_spec(spec),
                    PackageManager::Conda => check_conda_spec(spec),
                }
            };
            if let Err(reason) = checked {
                return Err(ExecError::BadRequest(format!(
                    "package spec {spec:?} is refused: {reason}"
                )));
            }
        }
        let entry = self.available_entry(req.env.as_deref())?;
        let mut cmd = match req.manager {
            PackageManager::Pip => {
                let mut cmd = self.command_in(entry, &entry.spec.python);
                cmd.args([
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--no-input",
                    "--",
                ]);
                cmd
            }
            PackageManager::Conda => {
                let conda = self.conda.as_ref().ok_or_else(|| {
                    ExecError::BadRequest(
                        "manager \"conda\" needs a conda, mamba or micromamba executable and none was found (set CONDA_EXE or put one on PATH)".into(),
                    )
                })?;
                let mut cmd = self.command_in(entry, conda);
                cmd.arg("install")
                    .arg("-y")
                    .arg("-p")
                    .arg(&entry.spec.prefix);
                cmd
            }
        };
        cmd.args(&req.packages);

        let _serialized = entry.install_lock.lock().await;
        let before = self.packages_of(entry).await.unwrap_or_default();
        tracing::info!(env = %entry.spec.name, manager = ?req.manager, packages = ?req.packages, "installing");
        let out = run_bounded(cmd, self.install_timeout)
            .await
            .map_err(|e| ExecError::Internal(format!("cannot run the installer: {e}")))?;
        let mut installed = Vec::new();
        if out.exit_code == 0 && !out.timed_out {
            entry.pool.replace();
            let after = self.packages_of(entry).await.unwrap_or_default();
            installed = after
                .into_iter()
                .filter(|p| !before.contains(p))
                .map(|p| format!("{}=={}", p.name, p.version))
                .collect();
        }
        Ok(InstallResult {
            env: entry.spec.name.clone(),
            exit_code: out.exit_code,
            stdout: out.stdout,
            stderr: out.stderr,
            installed,
            timed_out: out.timed_out,
        })
    }

    /// A command run in an environment as its workers are: activated
    /// variables only, a private `HOME`, no stdin.
    fn command_in(&self, entry: &EnvEntry, program: &Path) -> tokio::process::Command {
        let home = self.base_dir.path().join("home");
        let _ = std::fs::create_dir_all(&home);
        let mut cmd = tokio::process::Command::new(program);
        cmd.env_clear()
            .envs(worker_env(&entry.vars))
            .envs(
                INSTALL_VARS
                    .iter()
                    .filter_map(|k| std::env::var_os(k).map(|v| (OsString::from(k), v))),
            )
            .env("HOME", &home)
            .env("TMPDIR", self.base_dir.path())
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            .env("PIP_NO_INPUT", "1")
            .current_dir(&home);
        cmd
    }

    pub fn health(&self) -> Health {
        let envs: BTreeMap<_, _> = self
            .envs
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
            sandbox: self.sandbox.clone(),
            request_limits: self.request_limits,
        }
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
        futures_util::future::join_all(self.envs.iter().map(|e| e.pool.close())).await;
        if let Some(cgroups) = self.cgroups.clone() {
            let _ = tokio::task::spawn_blocking(move || {
                cgroups.remove_all(std::time::Duration::from_secs(3))
            })
            .await;
        }
    }

    /// The server's metrics (`GET /metrics`).
    /// The store of MCP runs' artifacts.
    pub fn artifacts(&self) -> &crate::artifacts::ArtifactStore {
        &self.artifacts
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Directory holding the bootstrap and the workers' scratch roots.
    pub fn base_dir(&self) -> &Path {
        self.base_dir.path()
    }
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

/// Lazy pools unused for `idle` stop their workers; checked a few times
/// per idle period, until every pool is closed.
async fn shrink_idle_pools(pools: Vec<EnvPool>, idle: Duration) {
    let tick = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    loop {
        tokio::time::sleep(tick).await;
        if pools.iter().all(EnvPool::is_closed) {
            return;
        }
        for pool in &pools {
            pool.shrink_if_idle(idle);
        }
    }
}

/// What a bounded helper process printed and how it ended.
struct ProcessOutput {
    exit_code: i32,
    stdout: String,
    stderr: String,
    timed_out: bool,
}

/// Run `cmd` in its own process group with captured output; past `timeout`
/// the whole group is killed and `timed_out` set.
async fn run_bounded(
    mut cmd: tokio::process::Command,
    timeout: Duration,
) -> std::io::Result<ProcessOutput> {
    use std::os::unix::process::ExitStatusExt;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().unwrap_or(0);
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(out) => {
            let out = out?;
            let code = out
                .status
                .code()
                .unwrap_or_else(|| -out.status.signal().unwrap_or(0));
            Ok(ProcessOutput {
                exit_code: code,
                stdout: capped(out.stdout),
                stderr: capped(out.stderr),
                timed_out: false,
            })
        }
        Err(_) => {
            kill_process_tree(pid);
            Ok(ProcessOutput {
                exit_code: -9,
                stdout: String::new(),
                stderr: format!("killed after the install timeout of {timeout:?}"),
                timed_out: true,
            })
        }
    }
}

/// Output as text, its tail kept when it is over the limit.
fn capped(mut bytes: Vec<u8>) -> String {
    if bytes.len() > INSTALL_OUTPUT_LIMIT {
        bytes.drain(..bytes.len() - INSTALL_OUTPUT_LIMIT);
    }
    utf8(bytes)
}

/// Which limit stopped a run, if one did.
pub fn limit_of(out: &crate::worker::RunOutput) -> Option<&'static str> {
    limit_hit(out, out.stdout_truncated || out.stderr_truncated)
}

/// A pool worker while its run is in flight. If the request is dropped
/// before the run answers (the client went away), the run is cancelled and
/// the worker goes back to its pool ([`EnvPool::cancel`]).
struct InFlight<'a> {
    worker: Option<deadpool::managed::Object<crate::pool::WorkerManager>>,
    pool: &'a EnvPool,
    restore_processes: bool,
}

impl InFlight<'_> {
    /// The worker, no longer cancelled on drop.
    fn take(&mut self) -> deadpool::managed::Object<crate::pool::WorkerManager> {
        self.worker.take().expect("taken once")
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.take() {
            self.pool.cancel(worker, self.restore_processes);
        }
    }
}

fn shape_result(out: crate::worker::RunOutput) -> ExecResult {
    let truncated = out.stdout_truncated || out.stderr_truncated;
    let limit = limit_hit(&out, truncated);
    ExecResult {
        stdout: utf8(out.stdout),
        stderr: utf8(out.stderr),
        exit_code: out.exit_code,
        artifacts: out
            .artifacts
            .into_iter()
            .map(|a| Artifact {
                path: a.path,
                size: a.size,
                mime: a.mime,
                base64: a
                    .data
                    .map(|d| base64::engine::general_purpose::STANDARD.encode(d)),
                omitted: a.omitted,
                uri: None,
            })
            .collect(),
        timed_out: out.timed_out,
        truncated,
        duration_ms: (out.duration_ms * 1000.0).round() / 1000.0,
        signal: out.signal,
        result: out.result,
        error: out.error.map(|e| RunError {
            kind: e.kind,
            message: e.message,
            traceback: e.traceback,
            line: e.line,
        }),
        limit: limit.map(str::to_string),
        session_lost: out.session_lost,
    }
}

/// `/health`'s account of the sandbox: what is enforced, the rlimits
/// every run gets and each env's scratch quota.
fn sandbox_status(sandbox: Option<&Sandbox>, envs: &[EnvEntry]) -> SandboxStatus {
    let mut status = sandbox.map(|s| s.status.clone()).unwrap_or_default();
    if sandbox.is_none() {
        status.memory = "rlimit_as";
    }
    if status.disk_quota {
        status.disk_bytes = envs
            .iter()
            .map(|e| (e.spec.name.clone(), e.settings.disk_bytes))
            .collect();
    }
    status.rlimits = ["cpu", "memory", "file_size", "open_files", "processes"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    status
}

/// Which limit stopped the run, from how it ended and from what the
/// worker's cgroups counted during it. In this order:
///
/// 1. The wall clock: `"timeout"`, unless the pids cgroup refused a fork or
///    a thread during the run. Then `"processes"`: a fork bomb that catches
///    its errors and retries until the deadline is stopped by the timeout,
///    but what to fix is the number of processes.
/// 2. The worker killed the run past its `limits.disk_bytes`: `"disk"`.
///    A resource signal: `SIGXCPU` → `"cpu"`, `SIGXFSZ` → `"file_size"`.
/// 3. An OOM kill in the worker's memory cgroup: `"memory"` (the run, or one
///    of its processes, was SIGKILLed by the kernel at the cap).
/// 4. An exception that only a limit raises: `MemoryError`; `EFBIG`;
///    `fork`/thread creation refused with `EAGAIN`; `ENOSPC` on the worker's
///    scratch tmpfs or its `/dev/shm` (`"disk"`).
/// 5. Any other failure while the pids cgroup refused a fork: `"processes"`.
/// 6. A stream cut at the output cap: `"output"`.
fn limit_hit(out: &crate::worker::RunOutput, truncated: bool) -> Option<&'static str> {
    if out.timed_out {
        return Some(if out.cgroup.pids_max {
            "processes"
        } else {
            "timeout"
        });
    }
    if out.disk_exceeded {
        return Some("disk");
    }
    match out.signal.as_deref() {
        Some("SIGXCPU") => return Some("cpu"),
        Some("SIGXFSZ") => return Some("file_size"),
        _ => {}
    }
    if out.cgroup.oom_kill {
        return Some("memory");
    }
    if let Some(e) = &out.error {
        let kind = e.kind.as_str();
        let message = e.message.as_str();
        if kind == "MemoryError" {
            return Some("memory");
        }
        if kind == "OSError" && message.contains("File too large") {
            return Some("file_size");
        }
        if kind == "OSError" && message.contains("No space left on device") {
            return Some("disk");
        }
        if (kind == "BlockingIOError" && message.contains("Resource temporarily unavailable"))
            || (kind == "RuntimeError" && message.contains("can't start new thread"))
        {
            return Some("processes");
        }
    }
    if out.cgroup.pids_max {
        return Some("processes");
    }
    if truncated {
        return Some("output");
    }
    None
}

/// Processes and threads of one run when the config sets no limit.
const DEFAULT_PROCESSES: u64 = 256;
/// Memory of a worker besides its run's, in its memory cgroup: the
/// interpreter and its preloads, the warm next child, the launcher, the
/// private `/dev/shm` (64 MiB at most) and kernel memory.
const WORKER_MEMORY: u64 = 256 << 20;

/// Hard ceilings for limits a request sets where the server sets none.
const MAX_PROCESSES: u64 = 4096;
const MAX_MEMORY_BYTES: u64 = 16 << 30;

/// A request's own limits, each within what the server allows: a request may
/// lower a configured limit, never raise it.
fn narrow_limits(configured: &RunLimits, asked: &RunLimits) -> Result<RunLimits, ExecError> {
    let pick = |name: &str, asked: Option<u64>, ceiling: Option<u64>| match asked {
        Some(0) => Err(ExecError::BadRequest(format!(
            "limits.{name} must be positive"
        ))),
        Some(v) => Ok(Some(ceiling.map_or(v, |c| v.min(c)))),
        None => Ok(ceiling),
    };
    Ok(RunLimits {
        cpu_seconds: pick("cpu_seconds", asked.cpu_seconds, configured.cpu_seconds)?,
        memory_bytes: pick(
            "memory_bytes",
            asked.memory_bytes,
            configured.memory_bytes.or(Some(MAX_MEMORY_BYTES)),
        )?,
        file_size_bytes: pick(
            "file_size_bytes",
            asked.file_size_bytes,
            configured.file_size_bytes,
        )?,
        open_files: pick("open_files", asked.open_files, configured.open_files)?,
        processes: pick(
            "processes",
            asked.processes,
            configured.processes.or(Some(MAX_PROCESSES)),
        )?,
        disk_bytes: pick("disk_bytes", asked.disk_bytes, configured.disk_bytes)?,
    })
}

/// Bytes as text without a copy when they are valid UTF-8.
fn utf8(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl ExecError {
    /// Whether the worker (not the request) failed.
    pub fn is_worker_fault(&self) -> bool {
        matches!(self, ExecError::Worker(_))
    }
}

impl From<WorkerError> for ExecError {
    fn from(e: WorkerError) -> Self {
        ExecError::Worker(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::cgroup::LimitEvents;
    use crate::worker::RunOutput;

    fn failed(exit_code: i32, signal: Option<&str>, cgroup: LimitEvents) -> RunOutput {
        RunOutput {
            exit_code,
            signal: signal.map(str::to_string),
            duration_ms: 1.0,
            cgroup,
            ..RunOutput::default()
        }
    }

    const PIDS_MAX: LimitEvents = LimitEvents {
        pids_max: true,
        oom_kill: false,
    };
    const OOM_KILL: LimitEvents = LimitEvents {
        pids_max: false,
        oom_kill: true,
    };

    #[test]
    fn a_timeout_at_the_pids_cap_is_a_process_limit() {
        let mut out = failed(-9, Some("SIGKILL"), LimitEvents::default());
        out.timed_out = true;
        assert_eq!(limit_hit(&out, false), Some("timeout"));
        out.cgroup = PIDS_MAX;
        assert_eq!(limit_hit(&out, false), Some("processes"));
        // An OOM kill of some process does not explain a run that was still
        // running at its deadline.
        out.cgroup = OOM_KILL;
        assert_eq!(limit_hit(&out, false), Some("timeout"));
    }

    #[test]
    fn an_oom_kill_is_a_memory_limit() {
        let out = failed(-9, Some("SIGKILL"), LimitEvents::default());
        assert_eq!(limit_hit(&out, false), None);
        let out = failed(-9, Some("SIGKILL"), OOM_KILL);
        assert_eq!(limit_hit(&out, false), Some("memory"));
        // A kernel resource signal names its own limit.
        let out = failed(-24, Some("SIGXCPU"), OOM_KILL);
        assert_eq!(limit_hit(&out, false), Some("cpu"));
    }

    #[test]
    fn a_failure_at_the_pids_cap_is_a_process_limit() {
        let out = failed(1, None, PIDS_MAX);
        assert_eq!(limit_hit(&out, false), Some("processes"));
        let out = failed(1, None, LimitEvents::default());
        assert_eq!(limit_hit(&out, true), Some("output"));
    }
}

//! The one service every front end calls: validates requests, picks the
//! environment's pool, runs the code on a worker and shapes the result.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::config::Config;
use crate::env::{EnvKind, EnvSpec};
use crate::error::{ExecError, PoolError, WorkerError};
use crate::pool::{EnvPool, PoolConfig, PoolStatus, error_chain};
use crate::protocol::{self, ExecFrame, FileEntry, RunLimits};
use crate::types::{ExecRequest, ExecResult, check_file_path};
use crate::worker::{WorkerSpec, worker_env};

/// The bootstrap every worker runs, embedded in the binary.
pub const WORKER_SCRIPT: &str = include_str!("../python/worker.py");

/// Extra time the server grants a worker beyond the run's own timeout before
/// it declares the worker unresponsive and kills it.
const HARD_DEADLINE_SLACK: Duration = Duration::from_secs(3);

/// One environment and its pool.
struct EnvEntry {
    spec: EnvSpec,
    pool: EnvPool,
}

/// Execution limits applied to every request.
#[derive(Debug, Clone)]
struct Limits {
    default_timeout: f64,
    max_timeout: f64,
    max_output_bytes: u64,
    run: RunLimits,
}

/// An environment as `/list-envs` and MCP `list_environments` show it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct EnvInfo {
    pub name: String,
    pub prefix: String,
    pub kind: String,
    pub python_version: Option<String>,
    pub default: bool,
    pub pool: PoolSummary,
}

/// Pool counts of one environment.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PoolSummary {
    pub size: usize,
    pub idle: usize,
    pub busy: usize,
}

/// Overall health: `ok` while at least one environment can serve.
#[derive(Debug, Clone, Serialize)]
pub struct Health {
    pub status: &'static str,
    pub envs: std::collections::BTreeMap<String, PoolStatus>,
}

/// Runs code in environments' worker pools.
pub struct Executor {
    envs: Vec<EnvEntry>,
    /// Index into `envs` of the environment used when a request names none.
    default: usize,
    limits: Limits,
    /// Holds the bootstrap script and every worker's scratch root; removed
    /// when the executor is dropped.
    base_dir: tempfile::TempDir,
    next_id: AtomicU64,
    /// Set by `shutdown`: new requests are refused.
    closing: AtomicBool,
}

impl Executor {
    /// Resolve the configured environment, start its pool and wait until it
    /// is warm.
    pub async fn start(config: &Config) -> anyhow::Result<Executor> {
        let spec = EnvSpec::resolve(&config.env)?;
        let base_dir = tempfile::Builder::new()
            .prefix("code-executor-")
            .tempdir()?;
        let script = match &config.worker_script {
            Some(path) => path.clone(),
            None => {
                let path = base_dir.path().join("worker.py");
                std::fs::write(&path, WORKER_SCRIPT)?;
                path
            }
        };
        let pool = EnvPool::new(
            worker_spec(&spec, &script, base_dir.path(), config),
            PoolConfig {
                size: config.pool_size,
                queue_timeout: config.queue_timeout,
                max_runs: config.max_runs,
            },
        );
        tracing::info!(
            env = %spec.name,
            python = %spec.python.display(),
            workers = config.pool_size,
            "starting worker pool"
        );
        pool.prewarm().await.map_err(|e| {
            anyhow::anyhow!(
                "environment {:?} cannot start workers: {}",
                spec.name,
                error_chain(&e)
            )
        })?;
        Ok(Executor {
            envs: vec![EnvEntry { spec, pool }],
            default: 0,
            limits: Limits {
                default_timeout: config.timeout,
                max_timeout: config.max_timeout,
                max_output_bytes: config.max_output_bytes,
                run: config.run_limits.clone(),
            },
            base_dir,
            next_id: AtomicU64::new(1),
            closing: AtomicBool::new(false),
        })
    }

    /// Run one request to completion.
    pub async fn execute(&self, req: ExecRequest) -> Result<ExecResult, ExecError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ExecError::ShuttingDown);
        }
        if req.session.is_some() {
            return Err(ExecError::BadRequest(
                "sessions are not available on this server".into(),
            ));
        }
        let entry = self.env_entry(req.env.as_deref())?;
        let timeout = match req.timeout {
            None => self.limits.default_timeout,
            Some(t) if t.is_finite() && t > 0.0 => t.min(self.limits.max_timeout),
            Some(t) => {
                return Err(ExecError::BadRequest(format!(
                    "timeout must be a positive number of seconds, got {t}"
                )));
            }
        };
        let mut contents = Vec::new();
        for (path, content) in req.files.iter().flatten() {
            check_file_path(path).map_err(ExecError::BadRequest)?;
            let bytes = content
                .to_bytes()
                .map_err(|e| ExecError::BadRequest(format!("file {path:?}: {e}")))?;
            contents.push((path.as_str(), bytes));
        }
        let mut run = self.limits.run.clone();
        run.cpu_seconds.get_or_insert(timeout.ceil() as u64 + 1);
        let frame = protocol::encode_frame(&ExecFrame {
            t: "exec",
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            code: &req.code,
            stdin: req.stdin.as_deref().map(str::as_bytes),
            files: contents
                .iter()
                .map(|(p, b)| FileEntry(p, b.as_slice()))
                .collect(),
            argv: &[],
            timeout,
            max_output: self.limits.max_output_bytes,
            limits: &run,
        })
        .map_err(|e| ExecError::BadRequest(format!("request cannot be encoded: {e}")))?;
        drop(contents);

        let mut worker = entry.pool.get().await.map_err(|e| match e {
            PoolError::Busy(_) => ExecError::Busy(e),
            PoolError::Closed => ExecError::ShuttingDown,
            PoolError::Unavailable(reason) => ExecError::EnvUnavailable {
                env: entry.spec.name.clone(),
                reason,
            },
        })?;
        let deadline = Duration::from_secs_f64(timeout) + HARD_DEADLINE_SLACK;
        match worker.execute(&frame, deadline).await {
            Ok(out) => {
                entry.pool.put(worker);
                Ok(shape_result(out))
            }
            Err(e) => {
                tracing::warn!(
                    env = %entry.spec.name,
                    worker_pid = worker.pid(),
                    "discarding worker: {}",
                    error_chain(&e)
                );
                entry.pool.discard(worker);
                Err(ExecError::Worker(e))
            }
        }
    }

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
                    kind: match e.spec.kind {
                        EnvKind::Conda => "conda",
                        EnvKind::Venv => "venv",
                        EnvKind::Python => "python",
                    }
                    .into(),
                    python_version: e.pool.python_version(),
                    default: i == self.default,
                    pool: PoolSummary {
                        size: status.size,
                        idle: status.idle,
                        busy: status.busy,
                    },
                }
            })
            .collect()
    }

    /// Name of the environment used when a request names none.
    pub fn default_env(&self) -> &str {
        &self.envs[self.default].spec.name
    }

    pub fn health(&self) -> Health {
        let envs: std::collections::BTreeMap<_, _> = self
            .envs
            .iter()
            .map(|e| (e.spec.name.clone(), e.pool.status()))
            .collect();
        let serving = !self.closing.load(Ordering::Acquire)
            && envs.values().any(|s| s.size > 0 || s.starting > 0);
        Health {
            status: if serving { "ok" } else { "unavailable" },
            envs,
        }
    }

    /// Refuse new requests and terminate every idle worker. Workers still
    /// running a request are terminated when they are returned.
    pub async fn shutdown(&self) {
        self.closing.store(true, Ordering::Release);
        futures_util::future::join_all(self.envs.iter().map(|e| e.pool.close())).await;
    }

    /// Directory holding the bootstrap and the workers' scratch roots.
    pub fn base_dir(&self) -> &Path {
        self.base_dir.path()
    }
}

fn worker_spec(spec: &EnvSpec, script: &Path, scratch: &Path, config: &Config) -> WorkerSpec {
    WorkerSpec {
        python: spec.python.clone(),
        script: script.to_path_buf(),
        scratch_parent: scratch.to_path_buf(),
        env: worker_env(&spec.activation),
        preload: config.preload.clone(),
        start_timeout: config.worker_start_timeout,
        grace_period: config.grace_period,
    }
}

fn shape_result(out: crate::worker::RunOutput) -> ExecResult {
    let truncated = out.stdout_truncated || out.stderr_truncated;
    let limit = if out.timed_out {
        Some("timeout")
    } else if out.signal.as_deref() == Some("SIGXCPU") {
        Some("cpu")
    } else if out.signal.as_deref() == Some("SIGXFSZ") {
        Some("file_size")
    } else if truncated {
        Some("output")
    } else {
        None
    };
    ExecResult {
        stdout: utf8(out.stdout),
        stderr: utf8(out.stderr),
        exit_code: out.exit_code,
        artifacts: Vec::new(),
        timed_out: out.timed_out,
        truncated,
        duration_ms: (out.duration_ms * 1000.0).round() / 1000.0,
        signal: out.signal,
        result: None,
        error: None,
        limit: limit.map(str::to_string),
    }
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

//! Configuration: command-line flags, `CODE_EXECUTOR_*` environment variables
//! and a TOML file set the same options. Flags (and their variables) win over
//! the file; the file wins over the defaults.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

use crate::env::{EnvChoice, HostEnv};
use crate::error::ConfigError;
use crate::executor::ResultLimits;
use crate::protocol::RunLimits;
use crate::sandbox::{Network, SandboxConfig};
use crate::session::SessionConfig;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Smallest scratch quota: room for the worker's own directories and a run's files.
const MIN_DISK_BYTES: u64 = MIB;

#[derive(Debug, Parser)]
#[command(
    name = "code-executor",
    version,
    about = "Run Python code in warm, isolated workers"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API (and MCP over streamable HTTP at /mcp).
    Serve(ServeCommand),
    /// Serve MCP over stdin/stdout (for MCP clients that launch servers).
    Mcp(ServeArgs),
    /// Print the environments this server can see.
    Envs(ServeArgs),
    /// Internal: start a program inside the worker sandbox (see `sandbox::launch`).
    #[command(hide = true)]
    SandboxExec(crate::sandbox::launch::LaunchArgs),
}

/// `code-executor serve`.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeCommand {
    #[command(flatten)]
    pub args: ServeArgs,
    /// Validate the configuration, print the environments it resolves to
    /// and exit (0 when valid) without serving.
    #[arg(long)]
    pub check_config: bool,
}

/// How log lines are written (to stderr).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Options shared by every subcommand that starts workers.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "CODE_EXECUTOR_HOST")]
    pub host: Option<IpAddr>,
    /// Port to listen on (0 picks a free one).
    #[arg(long, env = "CODE_EXECUTOR_PORT")]
    pub port: Option<u16>,
    /// TOML configuration file.
    #[arg(long, env = "CODE_EXECUTOR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Name of the Conda environment to run code in by default.
    #[arg(
        long,
        env = "CODE_EXECUTOR_CONDA_ENV",
        conflicts_with_all = ["conda_prefix", "python"]
    )]
    pub conda_env: Option<String>,
    /// Prefix of the Conda environment to run code in by default.
    #[arg(long, env = "CODE_EXECUTOR_CONDA_PREFIX", conflicts_with = "python")]
    pub conda_prefix: Option<PathBuf>,
    /// Python interpreter to run code with (any prefix or venv).
    #[arg(long, env = "CODE_EXECUTOR_PYTHON")]
    pub python: Option<PathBuf>,
    /// Default wall-clock timeout of a run, in seconds.
    #[arg(long, env = "CODE_EXECUTOR_TIMEOUT")]
    pub timeout: Option<f64>,
    /// Warm workers kept per environment.
    #[arg(long, env = "CODE_EXECUTOR_POOL_SIZE")]
    pub pool_size: Option<usize>,
    /// Modules every worker imports before it serves (comma-separated).
    #[arg(long, env = "CODE_EXECUTOR_PRELOAD", value_delimiter = ',')]
    pub preload: Option<Vec<String>>,
    /// Bearer token required by /execute, /list-envs and /list-packages.
    #[arg(long, env = "CODE_EXECUTOR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Bearer token required by admin endpoints (/install); without it
    /// installs are disabled.
    #[arg(long, env = "CODE_EXECUTOR_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Cap on live workers across all environments.
    #[arg(long, env = "CODE_EXECUTOR_MAX_WORKERS")]
    pub max_workers: Option<usize>,
    /// Seconds after which an idle, unconfigured environment's workers stop.
    #[arg(long, env = "CODE_EXECUTOR_IDLE_TIMEOUT")]
    pub idle_timeout: Option<f64>,
    /// Bound on one /install run, in seconds.
    #[arg(long, env = "CODE_EXECUTOR_INSTALL_TIMEOUT")]
    pub install_timeout: Option<f64>,
    /// Bearer token for GET /metrics; without it /metrics takes the API
    /// token (--token), and is open when there is none.
    #[arg(long, env = "CODE_EXECUTOR_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// Log line format: text (default) or json.
    #[arg(long, env = "CODE_EXECUTOR_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Most test cases one /grade request may carry.
    #[arg(long, env = "CODE_EXECUTOR_MAX_GRADE_CASES")]
    pub max_grade_cases: Option<usize>,
    /// Network of workers: `isolated` (own namespace, loopback only) or `host`.
    #[arg(long, env = "CODE_EXECUTOR_NETWORK")]
    pub network: Option<Network>,
    /// User (name or uid) workers run as, e.g. `nobody`.
    #[arg(long, env = "CODE_EXECUTOR_RUN_AS")]
    pub run_as: Option<String>,
    /// Allow listening on a non-loopback address without a token.
    #[arg(long, env = "CODE_EXECUTOR_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// Idle time to live of a session, in seconds (renewed by each call).
    #[arg(long, env = "CODE_EXECUTOR_SESSION_TTL")]
    pub session_ttl: Option<f64>,
    /// Cap on live sessions across all environments.
    #[arg(long, env = "CODE_EXECUTOR_MAX_SESSIONS")]
    pub max_sessions: Option<usize>,
    /// Give every MCP connection one implicit session: `execute_code`
    /// without `session` runs in it.
    #[arg(long, env = "CODE_EXECUTOR_MCP_IMPLICIT_SESSION")]
    pub mcp_implicit_session: Option<bool>,
}

/// The TOML file's shape; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub host: Option<IpAddr>,
    pub port: Option<u16>,
    pub conda_env: Option<String>,
    pub conda_prefix: Option<PathBuf>,
    pub python: Option<PathBuf>,
    pub timeout: Option<f64>,
    pub max_timeout: Option<f64>,
    pub pool_size: Option<usize>,
    pub preload: Option<Vec<String>>,
    pub token: Option<String>,
    pub admin_token: Option<String>,
    pub queue_timeout_secs: Option<f64>,
    pub max_runs: Option<u64>,
    pub max_output_bytes: Option<u64>,
    pub max_artifact_bytes: Option<u64>,
    pub max_artifacts_bytes: Option<u64>,
    pub max_result_chars: Option<u64>,
    pub max_body_bytes: Option<usize>,
    pub worker_start_timeout_secs: Option<f64>,
    pub grace_period_secs: Option<f64>,
    pub shutdown_timeout_secs: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub open_files: Option<u64>,
    pub file_size_bytes: Option<u64>,
    /// Size of each worker's scratch tmpfs: all its runs' files at once.
    pub disk_bytes: Option<u64>,
    /// Bootstrap script to run instead of the embedded one (testing aid).
    pub worker_script: Option<PathBuf>,
    /// Look for Conda environments (default true).
    pub discover: Option<bool>,
    pub max_workers: Option<usize>,
    pub idle_timeout_secs: Option<f64>,
    pub install_timeout_secs: Option<f64>,
    pub activation_timeout_secs: Option<f64>,
    pub metrics_token: Option<String>,
    pub log_format: Option<LogFormat>,
    pub max_grade_cases: Option<usize>,
    /// `isolated` (default) or `host`.
    pub network: Option<Network>,
    /// Start workers through the sandbox launcher (default true).
    pub sandbox: Option<bool>,
    /// Binary with the `sandbox-exec` subcommand (default: this one).
    pub launcher: Option<PathBuf>,
    /// Confine workers' filesystem access with Landlock (default true).
    pub landlock: Option<bool>,
    pub run_as: Option<String>,
    pub run_as_group: Option<String>,
    pub insecure_no_auth: Option<bool>,
    pub max_code_bytes: Option<usize>,
    pub max_files: Option<usize>,
    pub max_files_bytes: Option<usize>,
    pub session_ttl_secs: Option<f64>,
    pub max_session_ttl_secs: Option<f64>,
    pub max_sessions: Option<usize>,
    pub max_sessions_per_env: Option<usize>,
    pub session_interrupt_grace_secs: Option<f64>,
    pub mcp_implicit_session: Option<bool>,
    /// `[[envs]]` tables: environments configured one by one.
    #[serde(default)]
    pub envs: Vec<EnvTable>,
}

/// One `[[envs]]` table. `prefix` or `python` locate the environment; with
/// neither, `name` names a discovered Conda environment. The other keys
/// override the global settings for this environment.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvTable {
    pub name: Option<String>,
    pub prefix: Option<PathBuf>,
    pub python: Option<PathBuf>,
    /// The environment used when a request names none.
    #[serde(default)]
    pub default: bool,
    pub pool_size: Option<usize>,
    pub preload: Option<Vec<String>>,
    pub timeout: Option<f64>,
    pub max_timeout: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub open_files: Option<u64>,
    pub file_size_bytes: Option<u64>,
    pub cpu_seconds: Option<u64>,
    pub processes: Option<u64>,
    /// This env's network (`isolated` or `host`); the global one when absent.
    pub network: Option<Network>,
    /// Size of this env's workers' scratch tmpfs; the global one when absent.
    pub disk_bytes: Option<u64>,
}

/// A resolved `[[envs]]` table.
#[derive(Debug, Clone)]
pub struct EnvConfig {
    /// Name in requests; derived from the prefix when absent.
    pub name: Option<String>,
    pub location: EnvChoice,
    pub default: bool,
    pub pool_size: usize,
    pub preload: Vec<String>,
    pub timeout: f64,
    pub max_timeout: f64,
    pub run_limits: RunLimits,
    pub network: Network,
    /// Size of each worker's scratch tmpfs.
    pub disk_bytes: u64,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: IpAddr,
    pub port: u16,
    pub env: EnvChoice,
    /// Default wall-clock timeout of a run, seconds.
    pub timeout: f64,
    /// Largest timeout a request may ask for, seconds.
    pub max_timeout: f64,
    pub pool_size: usize,
    pub preload: Vec<String>,
    pub token: Option<String>,
    pub admin_token: Option<String>,
    /// How long a request waits for a free worker before `503 busy`.
    pub queue_timeout: Duration,
    /// Runs after which a worker is replaced (0: never).
    pub max_runs: u64,
    /// Output kept per stream and run.
    pub max_output_bytes: u64,
    /// Caps on artifacts and on the `result` repr.
    pub results: ResultLimits,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Bound on a worker's start and handshake (preloads included).
    pub worker_start_timeout: Duration,
    /// Between the steps of terminating a worker.
    pub grace_period: Duration,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_timeout: Duration,
    /// Resource limits applied to every run.
    pub run_limits: RunLimits,
    pub worker_script: Option<PathBuf>,
    /// Environments configured one by one (`[[envs]]`); pre-warmed.
    pub envs: Vec<EnvConfig>,
    /// Whether Conda environments are discovered (and served lazily).
    pub discover: bool,
    /// Cap on live workers across all pools: keeps many environments from
    /// starting an interpreter each beyond what the machine can hold.
    pub max_workers: usize,
    /// Idle time after which a discovered (unconfigured) env's workers stop.
    pub idle_timeout: Duration,
    /// Bound on one install run.
    pub install_timeout: Duration,
    /// Bound on running an env's activation scripts (and on each Conda query
    /// during discovery).
    pub activation_timeout: Duration,
    /// What discovery reads from the server's environment (PATH, CONDA_EXE,
    /// CONDA_PREFIX, HOME).
    pub host_env: HostEnv,
    /// Bearer token for `/metrics` (else `token` guards it).
    pub metrics_token: Option<String>,
    pub log_format: LogFormat,
    /// Most test cases one `/grade` request may carry: bounds the work (and
    /// the answer) one request can ask for.
    pub max_grade_cases: usize,
    /// How workers are confined.
    pub sandbox: SandboxConfig,
    /// Listening on a non-loopback address without a token was asked for.
    pub insecure_no_auth: bool,
    /// Limits on one request's parts, each answered with 413 when exceeded.
    pub request_limits: RequestLimits,
    /// Session lifetimes and caps.
    pub sessions: SessionConfig,
    /// Every MCP connection gets one implicit session, closed with it.
    pub mcp_implicit_session: bool,
}

/// Caps on what one request may carry (the body as a whole is capped by
/// `max_body_bytes`).
#[derive(Debug, Clone, Copy, serde::Serialize, utoipa::ToSchema)]
pub struct RequestLimits {
    /// Bytes of `code`.
    pub max_code_bytes: usize,
    /// Entries in `files`.
    pub max_files: usize,
    /// Decoded bytes of all `files` together.
    pub max_files_bytes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            host: IpAddr::from([127, 0, 0, 1]),
            port: 8080,
            env: EnvChoice::Default,
            timeout: 30.0,
            max_timeout: 300.0,
            pool_size: 4,
            preload: Vec::new(),
            token: None,
            admin_token: None,
            queue_timeout: Duration::from_secs(10),
            max_runs: 10_000,
            max_output_bytes: MIB,
            results: ResultLimits {
                max_artifact_bytes: 10 * MIB,
                max_artifacts_bytes: 32 * MIB,
                max_result_chars: 10_000,
            },
            max_body_bytes: 32 * MIB as usize,
            worker_start_timeout: Duration::from_secs(60),
            grace_period: Duration::from_secs(1),
            shutdown_timeout: Duration::from_secs(30),
            run_limits: RunLimits {
                cpu_seconds: None,
                memory_bytes: Some(2 * GIB),
                file_size_bytes: Some(GIB),
                open_files: Some(1024),
                processes: None,
                // A request's own; the env's scratch tmpfs is `disk_bytes`.
                disk_bytes: None,
            },
            worker_script: None,
            envs: Vec::new(),
            discover: true,
            max_workers: 32,
            idle_timeout: Duration::from_secs(300),
            install_timeout: Duration::from_secs(600),
            activation_timeout: Duration::from_secs(30),
            host_env: HostEnv::from_process(),
            metrics_token: None,
            log_format: LogFormat::Text,
            max_grade_cases: 1000,
            sandbox: SandboxConfig::default(),
            insecure_no_auth: false,
            request_limits: RequestLimits {
                max_code_bytes: 4 * MIB as usize,
                max_files: 1000,
                max_files_bytes: 32 * MIB as usize,
            },
            sessions: SessionConfig::default(),
            mcp_implicit_session: false,
        }
    }
}

impl Config {
    /// Merge flags, the file they name (if any) and the defaults.
    pub fn load(args: &ServeArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        Config::merge(args, file)
    }

    pub fn merge(args: &ServeArgs, file: FileConfig) -> Result<Config, ConfigError> {
        let d = Config::default();
        let secs =
            |v: Option<f64>, name: &str, default: Duration| -> Result<Duration, ConfigError> {
                match v {
                    None => Ok(default),
                    Some(s) if s.is_finite() && s >= 0.0 => Ok(Duration::from_secs_f64(s)),
                    Some(s) => Err(ConfigError::Invalid(format!(
                        "{name} = {s} is not a duration"
                    ))),
                }
            };
        // A flag replaces whatever the file chose.
        let flagged =
            args.conda_env.is_some() || args.conda_prefix.is_some() || args.python.is_some();
        let (conda_env, conda_prefix, python) = if flagged {
            (
                args.conda_env.clone(),
                args.conda_prefix.clone(),
                args.python.clone(),
            )
        } else {
            (file.conda_env, file.conda_prefix, file.python)
        };
        let env = match (conda_env, conda_prefix, python) {
            (Some(name), None, None) => EnvChoice::CondaEnv(name),
            (None, Some(prefix), None) => EnvChoice::CondaPrefix(prefix),
            (None, None, Some(python)) => EnvChoice::Python(python),
            (None, None, None) => EnvChoice::Default,
            _ => {
                return Err(ConfigError::Invalid(
                    "conda_env, conda_prefix and python each name an environment; give one".into(),
                ));
            }
        };
        let timeout = args.timeout.or(file.timeout).unwrap_or(d.timeout);
        let max_timeout = file.max_timeout.unwrap_or(d.max_timeout);
        let pool_size = args.pool_size.or(file.pool_size).unwrap_or(d.pool_size);
        let preload = args.preload.clone().or(file.preload).unwrap_or_default();
        let run_limits = RunLimits {
            memory_bytes: file.memory_bytes.or(d.run_limits.memory_bytes),
            file_size_bytes: file.file_size_bytes.or(d.run_limits.file_size_bytes),
            open_files: file.open_files.or(d.run_limits.open_files),
            ..d.run_limits
        };
        let network = args.network.or(file.network).unwrap_or_default();
        let disk_bytes = file.disk_bytes.unwrap_or(d.sandbox.disk_bytes);
        let envs = file
            .envs
            .into_iter()
            .map(|t| {
                let location = match (&t.prefix, &t.python, &t.name) {
                    (Some(prefix), None, _) => EnvChoice::CondaPrefix(prefix.clone()),
                    (None, Some(python), _) => EnvChoice::Python(python.clone()),
                    (None, None, Some(name)) => EnvChoice::CondaEnv(name.clone()),
                    (None, None, None) => {
                        return Err(ConfigError::Invalid(
                            "an [[envs]] table needs a prefix, a python or the name of a Conda env"
                                .into(),
                        ));
                    }
                    (Some(_), Some(_), _) => {
                        return Err(ConfigError::Invalid(format!(
                            "[[envs]] {}: give prefix or python, not both",
                            t.name.as_deref().unwrap_or("(unnamed)")
                        )));
                    }
                };
                Ok(EnvConfig {
                    name: t.name,
                    location,
                    default: t.default,
                    pool_size: t.pool_size.unwrap_or(pool_size),
                    preload: t.preload.unwrap_or_else(|| preload.clone()),
                    timeout: t.timeout.unwrap_or(timeout),
                    max_timeout: t.max_timeout.unwrap_or(max_timeout),
                    run_limits: RunLimits {
                        memory_bytes: t.memory_bytes.or(run_limits.memory_bytes),
                        file_size_bytes: t.file_size_bytes.or(run_limits.file_size_bytes),
                        open_files: t.open_files.or(run_limits.open_files),
                        cpu_seconds: t.cpu_seconds.or(run_limits.cpu_seconds),
                        processes: t.processes.or(run_limits.processes),
                        disk_bytes: None,
                    },
                    network: t.network.unwrap_or(network),
                    disk_bytes: t.disk_bytes.unwrap_or(disk_bytes),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let config = Config {
            host: args.host.or(file.host).unwrap_or(d.host),
            port: args.port.or(file.port).unwrap_or(d.port),
            env,
            timeout,
            max_timeout,
            pool_size,
            preload,
            token: args.token.clone().or(file.token).filter(|t| !t.is_empty()),
            admin_token: args
                .admin_token
                .clone()
                .or(file.admin_token)
                .filter(|t| !t.is_empty()),
            queue_timeout: secs(
                file.queue_timeout_secs,
                "queue_timeout_secs",
                d.queue_timeout,
            )?,
            max_runs: file.max_runs.unwrap_or(d.max_runs),
            max_output_bytes: file.max_output_bytes.unwrap_or(d.max_output_bytes),
            results: ResultLimits {
                max_artifact_bytes: file
                    .max_artifact_bytes
                    .unwrap_or(d.results.max_artifact_bytes),
                max_artifacts_bytes: file
                    .max_artifacts_bytes
                    .unwrap_or(d.results.max_artifacts_bytes),
                max_result_chars: file.max_result_chars.unwrap_or(d.results.max_result_chars),
            },
            max_body_bytes: file.max_body_bytes.unwrap_or(d.max_body_bytes),
            worker_start_timeout: secs(
                file.worker_start_timeout_secs,
                "worker_start_timeout_secs",
                d.worker_start_timeout,
            )?,
            grace_period: secs(file.grace_period_secs, "grace_period_secs", d.grace_period)?,
            shutdown_timeout: secs(
                file.shutdown_timeout_secs,
                "shutdown_timeout_secs",
                d.shutdown_timeout,
            )?,
            run_limits,
            sandbox: SandboxConfig {
                enabled: file.sandbox.unwrap_or(d.sandbox.enabled),
                launcher: file.launcher,
                network,
                landlock: file.landlock.unwrap_or(d.sandbox.landlock),
                run_as: args.run_as.clone().or(file.run_as),
                run_as_group: file.run_as_group,
                disk_bytes,
            },
            insecure_no_auth: args.insecure_no_auth || file.insecure_no_auth.unwrap_or(false),
            request_limits: RequestLimits {
                max_code_bytes: file
                    .max_code_bytes
                    .unwrap_or(d.request_limits.max_code_bytes),
                max_files: file.max_files.unwrap_or(d.request_limits.max_files),
                max_files_bytes: file
                    .max_files_bytes
                    .unwrap_or(d.request_limits.max_files_bytes),
            },
            worker_script: file.worker_script,
            envs,
            discover: file.discover.unwrap_or(d.discover),
            max_workers: args
                .max_workers
                .or(file.max_workers)
                .unwrap_or(d.max_workers),
            idle_timeout: secs(
                args.idle_timeout.or(file.idle_timeout_secs),
                "idle_timeout",
                d.idle_timeout,
            )?,
            install_timeout: secs(
                args.install_timeout.or(file.install_timeout_secs),
                "install_timeout",
                d.install_timeout,
            )?,
            activation_timeout: secs(
                file.activation_timeout_secs,
                "activation_timeout_secs",
                d.activation_timeout,
            )?,
            host_env: d.host_env,
            metrics_token: args
                .metrics_token
                .clone()
                .or(file.metrics_token)
                .filter(|t| !t.is_empty()),
            log_format: args.log_format.or(file.log_format).unwrap_or(d.log_format),
            max_grade_cases: args
                .max_grade_cases
                .or(file.max_grade_cases)
                .unwrap_or(d.max_grade_cases),
            sessions: SessionConfig {
                ttl: secs(
                    args.session_ttl.or(file.session_ttl_secs),
                    "session_ttl",
                    d.sessions.ttl,
                )?,
                max_ttl: secs(
                    file.max_session_ttl_secs,
                    "max_session_ttl_secs",
                    d.sessions.max_ttl,
                )?,
                max_sessions: args
                    .max_sessions
                    .or(file.max_sessions)
                    .unwrap_or(d.sessions.max_sessions),
                max_sessions_per_env: file
                    .max_sessions_per_env
                    .unwrap_or(d.sessions.max_sessions_per_env),
                interrupt_grace: secs(
                    file.session_interrupt_grace_secs,
                    "session_interrupt_grace_secs",
                    d.sessions.interrupt_grace,
                )?,
            },
            mcp_implicit_session: args
                .mcp_implicit_session
                .or(file.mcp_implicit_session)
                .unwrap_or(d.mcp_implicit_session),
        };
        config.validate()?;
        if !config.host.is_loopback() && config.token.is_none() && !config.insecure_no_auth {
            return Err(ConfigError::Invalid(format!(
                "refusing to listen on {} without a token: set --token (or CODE_EXECUTOR_TOKEN), or pass --insecure-no-auth to serve anyone who can reach it",
                config.host
            )));
        }
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.pool_size == 0 {
            return Err(ConfigError::Invalid("pool_size must be at least 1".into()));
        }
        if self.max_grade_cases == 0 {
            return Err(ConfigError::Invalid(
                "max_grade_cases must be at least 1".into(),
            ));
        }
        if !(self.timeout.is_finite() && self.timeout > 0.0) {
            return Err(ConfigError::Invalid(format!(
                "timeout must be a positive number of seconds, got {}",
                self.timeout
            )));
        }
        if self.timeout > self.max_timeout {
            return Err(ConfigError::Invalid(format!(
                "timeout {} exceeds max_timeout {}",
                self.timeout, self.max_timeout
            )));
        }
        if self.max_output_bytes == 0 {
            return Err(ConfigError::Invalid(
                "max_output_bytes must be positive".into(),
            ));
        }
        if self.max_workers == 0 {
            return Err(ConfigError::Invalid(
                "max_workers must be at least 1".into(),
            ));
        }
        if self.sandbox.disk_bytes < MIN_DISK_BYTES {
            return Err(ConfigError::Invalid(format!(
                "disk_bytes must be at least {MIN_DISK_BYTES} (1 MiB)"
            )));
        }
        for env in &self.envs {
            let name = env.name.as_deref().unwrap_or("(unnamed)");
            if env.disk_bytes < MIN_DISK_BYTES {
                return Err(ConfigError::Invalid(format!(
                    "[[envs]] {name}: disk_bytes must be at least {MIN_DISK_BYTES} (1 MiB)"
                )));
            }
            if env.pool_size == 0 {
                return Err(ConfigError::Invalid(format!(
                    "[[envs]] {name}: pool_size must be at least 1"
                )));
            }
            if !(env.timeout.is_finite() && env.timeout > 0.0 && env.timeout <= env.max_timeout) {
                return Err(ConfigError::Invalid(format!(
                    "[[envs]] {name}: timeout must be positive and at most max_timeout"
                )));
            }
        }
        if self.sessions.ttl.is_zero() || self.sessions.ttl > self.sessions.max_ttl {
            return Err(ConfigError::Invalid(format!(
                "session_ttl must be positive and at most max_session_ttl ({} s)",
                self.sessions.max_ttl.as_secs_f64()
            )));
        }
        if self.envs.iter().filter(|e| e.default).count() > 1 {
            return Err(ConfigError::Invalid(
                "more than one [[envs]] table says default = true".into(),
            ));
        }
        Ok(())
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_file(&text).map_err(|message| ConfigError::Parse {
        path: path.to_path_buf(),
        message,
    })
}

/// Parse a TOML config; an error names its line and column
/// (`line 3, column 1: unknown field ...`).
pub fn parse_file(text: &str) -> Result<FileConfig, String> {
    toml::from_str(text).map_err(|e| {
        let what = e.message().trim_end().to_string();
        match e.span() {
            Some(span) => {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!("line {line}, column {column}: {what}")
            }
            None => what,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file() {
        let file: FileConfig = toml::from_str("port = 9000\npool_size = 3\ntimeout = 5").unwrap();
        let args = ServeArgs {
            port: Some(9100),
            ..Default::default()
        };
        let c = Config::merge(&args, file).unwrap();
        assert_eq!(c.port, 9100);
        assert_eq!(c.pool_size, 3);
        assert_eq!(c.timeout, 5.0);
        assert_eq!(c.host.to_string(), "127.0.0.1");
    }

    #[test]
    fn envs_tables_inherit_global_settings() {
        let file: FileConfig = toml::from_str(
            r#"
            pool_size = 3
            timeout = 5
            [[envs]]
            name = "ml"
            pool_size = 1
            preload = ["json"]
            memory_bytes = 1024
            [[envs]]
            prefix = "/opt/envs/tools"
            default = true
            "#,
        )
        .unwrap();
        let c = Config::merge(&ServeArgs::default(), file).unwrap();
        assert_eq!(c.envs.len(), 2);
        assert_eq!(c.envs[0].location, EnvChoice::CondaEnv("ml".into()));
        assert_eq!(c.envs[0].pool_size, 1);
        assert_eq!(c.envs[0].preload, vec!["json".to_string()]);
        assert_eq!(c.envs[0].run_limits.memory_bytes, Some(1024));
        assert_eq!(c.envs[0].timeout, 5.0);
        assert_eq!(c.envs[1].pool_size, 3);
        assert!(c.envs[1].default);
        assert_eq!(
            c.envs[1].location,
            EnvChoice::CondaPrefix("/opt/envs/tools".into())
        );
        let bad: FileConfig = toml::from_str("[[envs]]\npool_size = 2").unwrap();
        assert!(Config::merge(&ServeArgs::default(), bad).is_err());
        assert!(toml::from_str::<FileConfig>("[[envs]]\nname = 'x'\nsize = 2").is_err());
    }

    #[test]
    fn the_disk_quota_is_global_or_per_env() {
        let c = Config::merge(&ServeArgs::default(), FileConfig::default()).unwrap();
        assert_eq!(c.sandbox.disk_bytes, 256 << 20);
        let file: FileConfig = toml::from_str(
            "disk_bytes = 67108864\n[[envs]]\nname = 'a'\n[[envs]]\nname = 'b'\ndisk_bytes = 2097152",
        )
        .unwrap();
        let c = Config::merge(&ServeArgs::default(), file).unwrap();
        assert_eq!(c.sandbox.disk_bytes, 64 << 20);
        assert_eq!(c.envs[0].disk_bytes, 64 << 20);
        assert_eq!(c.envs[1].disk_bytes, 2 << 20);
        for text in ["disk_bytes = 1000", "[[envs]]\nname = 'a'\ndisk_bytes = 0"] {
            let file: FileConfig = toml::from_str(text).unwrap();
            let err = Config::merge(&ServeArgs::default(), file).unwrap_err();
            assert!(err.to_string().contains("disk_bytes"), "{err}");
        }
    }

    #[test]
    fn an_env_flag_replaces_the_files_choice() {
        let file: FileConfig = toml::from_str("python = '/usr/bin/python3'").unwrap();
        let args = ServeArgs {
            conda_env: Some("ml".into()),
            ..Default::default()
        };
        let c = Config::merge(&args, file).unwrap();
        assert_eq!(c.env, EnvChoice::CondaEnv("ml".into()));
    }

    #[test]
    fn parse_errors_name_the_line() {
        let err = parse_file("port = 8080\n\npool_sise = 2\n").unwrap_err();
        assert!(err.starts_with("line 3, column 1: "), "{err}");
        assert!(err.contains("pool_sise"), "{err}");
        let err = parse_file("port = 8080\ntimeout = \"x\"\n").unwrap_err();
        assert!(err.starts_with("line 2, column 11: "), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        assert!(toml::from_str::<FileConfig>("prot = 1").is_err());
        let file: FileConfig = toml::from_str("pool_size = 0").unwrap();
        let err = Config::merge(&ServeArgs::default(), file).unwrap_err();
        assert!(err.to_string().contains("pool_size"), "{err}");
    }
}

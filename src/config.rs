//! Configuration: command-line flags, `CODE_EXECUTOR_*` environment variables
//! and a TOML file set the same options. One precedence, highest first:
//!
//! 1. command-line flags;
//! 2. `CODE_EXECUTOR_*` variables;
//! 3. `CONDA_ENV_NAME` (the default environment only);
//! 4. the config file: `--config`/`CODE_EXECUTOR_CONFIG`, else
//!    `/etc/code-executor/config.toml` when it exists;
//! 5. the defaults file `CODE_EXECUTOR_DEFAULTS` names (a container image's
//!    own settings), then the built-in defaults.
//!
//! The three options that choose the default environment (`conda_env`,
//! `conda_prefix`, `python`) are one choice: the highest source that names an
//! environment decides, so an image's variable never conflicts with a user's
//! flag. Two flags, or two keys of one file, are still an error; among the
//! variables the most specific wins (`CODE_EXECUTOR_CONDA_ENV`, then
//! `CODE_EXECUTOR_CONDA_PREFIX`, then `CODE_EXECUTOR_PYTHON`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

use crate::env::{EnvChoice, EnvVars, HostEnv};
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
    // The three env-choosing flags read no variable here: their variables
    // (and CONDA_ENV_NAME) rank below every flag and are read in
    // `Config::merge_with` from `HostEnv`, so that an image's variable and a
    // user's flag never make a clap conflict.
    /// Name of the Conda environment to run code in by default; wins over
    /// the variables CODE_EXECUTOR_CONDA_ENV and CONDA_ENV_NAME.
    #[arg(long, conflicts_with_all = ["conda_prefix", "python"])]
    pub conda_env: Option<String>,
    /// Prefix of the Conda environment to run code in by default; wins over
    /// the variable CODE_EXECUTOR_CONDA_PREFIX.
    #[arg(long, conflicts_with = "python")]
    pub conda_prefix: Option<PathBuf>,
    /// Python interpreter (any prefix or venv) to run code with; wins over
    /// the variable CODE_EXECUTOR_PYTHON.
    #[arg(long)]
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
    /// Sandbox tier: `auto` (namespaces where the host can make them, else
    /// the container tier), `namespaces` or `container`.
    #[arg(long, env = "CODE_EXECUTOR_SANDBOX_TIER")]
    pub sandbox_tier: Option<crate::sandbox::TierChoice>,
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
    /// This replica's name among others behind a load balancer (in /health,
    /// session ids and the x-replica header); default: the host name.
    #[arg(long, env = "CODE_EXECUTOR_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// Seconds /health answers 503 (draining) after SIGTERM, while the
    /// server still serves everything, before it stops accepting.
    #[arg(long, env = "CODE_EXECUTOR_DRAIN_DELAY")]
    pub drain_delay: Option<f64>,
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
    /// `auto` (default), `namespaces` or `container`.
    pub sandbox_tier: Option<crate::sandbox::TierChoice>,
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
    pub artifact_ttl_secs: Option<f64>,
    pub artifact_store_bytes: Option<u64>,
    pub artifact_owner_bytes: Option<u64>,
    pub mcp_max_artifact_bytes: Option<u64>,
    pub mcp_inline_image_bytes: Option<usize>,
    pub max_image_pixels: Option<u64>,
    pub header_read_timeout_secs: Option<f64>,
    pub body_read_timeout_secs: Option<f64>,
    pub max_connections: Option<usize>,
    pub replica_id: Option<String>,
    pub drain_delay_secs: Option<f64>,
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
    /// `token` was generated at start (none was configured and the address
    /// is not loopback): the server prints it once in its log.
    pub token_generated: bool,
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
    /// Bounds on HTTP connections, so that slow or silent clients hold
    /// nothing for long.
    pub connections: ConnectionLimits,
    /// How long and how much of MCP runs' artifacts are kept (MCP
    /// resources, `GET /artifacts`).
    pub artifacts: crate::artifacts::ArtifactLimits,
    /// Largest artifact (and all of one run's together) an MCP run keeps.
    pub mcp_max_artifact_bytes: u64,
    /// Base64 bytes of images one MCP tool result carries inline (beside
    /// their `resource_link`s): keeps a result small enough for a model.
    pub mcp_inline_image_bytes: usize,
    /// Plots of MCP runs are saved with at most this many pixels.
    pub max_image_pixels: u64,
    /// This replica's name (see [`crate::replica`]).
    pub replica_id: String,
    /// How long readiness is off after SIGTERM before the server stops
    /// accepting: the time a balancer needs to notice and stop sending.
    pub drain_delay: Duration,
}

/// Bounds on the HTTP server's connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// How long a client may take to send a request's headers, counted from
    /// when the server waits for them: on a new connection, and between the
    /// requests of a kept-alive one (so it is the idle timeout too).
    pub header_read_timeout: Duration,
    /// How long a request's body may take to arrive once its headers did.
    pub body_read_timeout: Duration,
    /// Connections served at once; past it a new one gets `503` and is
    /// closed. Kept well below the descriptors the process may open.
    pub max_connections: usize,
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
            token_generated: false,
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
            artifacts: crate::artifacts::ArtifactLimits::default(),
            mcp_max_artifact_bytes: 64 * MIB,
            mcp_inline_image_bytes: 48 << 10,
            max_image_pixels: 1 << 20,
            connections: ConnectionLimits {
                header_read_timeout: Duration::from_secs(10),
                body_read_timeout: Duration::from_secs(60),
                max_connections: 4096,
            },
            replica_id: crate::replica::default_replica_id(),
            drain_delay: Duration::from_secs(5),
        }
    }
}

impl Config {
    /// Merge flags, the process's variables, the config file and the
    /// defaults (see the module docs for the order).
    pub fn load(args: &ServeArgs) -> Result<Config, ConfigError> {
        Config::load_with(args, HostEnv::from_process())
    }

    /// [`Config::load`] with `host` standing for the process's environment:
    /// the config file is `--config`, else `host.system_config` when it
    /// exists, laid over `host.defaults_file`.
    pub fn load_with(args: &ServeArgs, host: HostEnv) -> Result<Config, ConfigError> {
        let path = args
            .config
            .clone()
            .or_else(|| host.system_config.clone().filter(|p| p.exists()));
        let mut table = match &host.defaults_file {
            Some(defaults) => read_table(defaults)?,
            None => toml::Table::new(),
        };
        if let Some(path) = &path {
            // Key by key: the file's keys replace the defaults' (`envs` whole).
            table.extend(read_table(path)?);
        }
        let file: FileConfig =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    path: path.or(host.defaults_file.clone()).unwrap_or_default(),
                    message: e.message().trim_end().to_string(),
                })?;
        Config::merge_with(args, file, host)
    }

    /// Merge flags, `file` and the defaults, with the process's variables.
    pub fn merge(args: &ServeArgs, file: FileConfig) -> Result<Config, ConfigError> {
        Config::merge_with(args, file, HostEnv::from_process())
    }

    /// Merge flags, the variables of `host`, `file` and the defaults.
    pub fn merge_with(
        args: &ServeArgs,
        mut file: FileConfig,
        host: HostEnv,
    ) -> Result<Config, ConfigError> {
        let d = Config::default();
        let secs =
            |v: Option<f64>, name: &str, default: Duration| -> Result<Duration, ConfigError> {
                match v {
                    None => Ok(default),
                    Some(s) if s.is_finite() && s >= 0.0 => Duration::try_from_secs_f64(s)
                        .map_err(|_| ConfigError::Invalid(format!("{name} = {s} is too long"))),
                    Some(s) => Err(ConfigError::Invalid(format!(
                        "{name} = {s} is not a duration"
                    ))),
                }
            };
        let env = choose_env(args, &host.env_vars, &mut file)?;
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
        let mut config = Config {
            host: args.host.or(file.host).unwrap_or(d.host),
            port: args.port.or(file.port).unwrap_or(d.port),
            env,
            timeout,
            max_timeout,
            pool_size,
            preload,
            token: args.token.clone().or(file.token).filter(|t| !t.is_empty()),
            token_generated: false,
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
                tier: args.sandbox_tier.or(file.sandbox_tier).unwrap_or_default(),
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
            host_env: host,
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
            artifacts: crate::artifacts::ArtifactLimits {
                ttl: secs(file.artifact_ttl_secs, "artifact_ttl_secs", d.artifacts.ttl)?,
                max_bytes: file.artifact_store_bytes.unwrap_or(d.artifacts.max_bytes),
                max_owner_bytes: file
                    .artifact_owner_bytes
                    .unwrap_or(d.artifacts.max_owner_bytes),
            },
            mcp_max_artifact_bytes: file
                .mcp_max_artifact_bytes
                .unwrap_or(d.mcp_max_artifact_bytes),
            mcp_inline_image_bytes: file
                .mcp_inline_image_bytes
                .unwrap_or(d.mcp_inline_image_bytes),
            max_image_pixels: file.max_image_pixels.unwrap_or(d.max_image_pixels),
            connections: ConnectionLimits {
                header_read_timeout: secs(
                    file.header_read_timeout_secs,
                    "header_read_timeout_secs",
                    d.connections.header_read_timeout,
                )?,
                body_read_timeout: secs(
                    file.body_read_timeout_secs,
                    "body_read_timeout_secs",
                    d.connections.body_read_timeout,
                )?,
                max_connections: file
                    .max_connections
                    .unwrap_or(d.connections.max_connections),
            },
            replica_id: args
                .replica_id
                .clone()
                .or(file.replica_id)
                .filter(|id| !id.is_empty())
                .unwrap_or(d.replica_id),
            drain_delay: secs(
                args.drain_delay.or(file.drain_delay_secs),
                "drain_delay",
                d.drain_delay,
            )?,
        };
        config.validate()?;
        // As Jupyter does: beyond loopback, a server nobody gave a token
        // makes its own (printed once in the log) rather than refusing to
        // start; only --insecure-no-auth serves without one.
        if !config.host.is_loopback() && config.token.is_none() && !config.insecure_no_auth {
            config.token = Some(random_token().map_err(ConfigError::Token)?);
            config.token_generated = true;
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
        if self.connections.max_connections == 0
            || self.connections.header_read_timeout.is_zero()
            || self.connections.body_read_timeout.is_zero()
        {
            return Err(ConfigError::Invalid(
                "max_connections, header_read_timeout_secs and body_read_timeout_secs must be positive"
                    .into(),
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
        crate::replica::check_replica_id(&self.replica_id).map_err(ConfigError::Invalid)?;
        if self.envs.iter().filter(|e| e.default).count() > 1 {
            return Err(ConfigError::Invalid(
                "more than one [[envs]] table says default = true".into(),
            ));
        }
        Ok(())
    }
}

/// The default environment, from the highest source that names one: flags,
/// `CODE_EXECUTOR_*` variables (the most specific first), `CONDA_ENV_NAME`,
/// the file; else [`EnvChoice::Default`].
fn choose_env(
    args: &ServeArgs,
    vars: &EnvVars,
    file: &mut FileConfig,
) -> Result<EnvChoice, ConfigError> {
    fn one(
        name: Option<String>,
        prefix: Option<PathBuf>,
        python: Option<PathBuf>,
        what: &str,
    ) -> Result<Option<EnvChoice>, ConfigError> {
        match (name, prefix, python) {
            (Some(name), None, None) => Ok(Some(EnvChoice::CondaEnv(name))),
            (None, Some(prefix), None) => Ok(Some(EnvChoice::CondaPrefix(prefix))),
            (None, None, Some(python)) => Ok(Some(EnvChoice::Python(python))),
            (None, None, None) => Ok(None),
            _ => Err(ConfigError::Invalid(format!(
                "{what} each name an environment; give one"
            ))),
        }
    }
    // clap refuses two flags already; a ServeArgs built in code is checked too.
    let flagged = one(
        args.conda_env.clone(),
        args.conda_prefix.clone(),
        args.python.clone(),
        "--conda-env, --conda-prefix and --python",
    )?;
    let variable = vars
        .conda_env
        .clone()
        .map(EnvChoice::CondaEnv)
        .or_else(|| vars.conda_prefix.clone().map(EnvChoice::CondaPrefix))
        .or_else(|| vars.python.clone().map(EnvChoice::Python))
        .or_else(|| vars.conda_env_name.clone().map(EnvChoice::CondaEnv));
    if let Some(choice) = flagged.or(variable) {
        return Ok(choice);
    }
    Ok(one(
        file.conda_env.take(),
        file.conda_prefix.take(),
        file.python.take(),
        "conda_env, conda_prefix and python",
    )?
    .unwrap_or(EnvChoice::Default))
}

/// 32 random bytes from `/dev/urandom`, in hex.
fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A TOML file as a table, checked against [`FileConfig`] (so that an error
/// names its file, line and column).
fn read_table(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let parse_error = |message| ConfigError::Parse {
        path: path.to_path_buf(),
        message,
    };
    parse_file(&text).map_err(parse_error)?;
    text.parse::<toml::Table>()
        .map_err(|e| parse_error(e.message().trim_end().to_string()))
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

    /// Merge with a host that sets no variable and has no config files.
    fn merge(args: &ServeArgs, file: FileConfig) -> Result<Config, ConfigError> {
        Config::merge_with(args, file, HostEnv::default())
    }

    #[test]
    fn flags_win_over_the_file() {
        let file: FileConfig = toml::from_str("port = 9000\npool_size = 3\ntimeout = 5").unwrap();
        let args = ServeArgs {
            port: Some(9100),
            ..Default::default()
        };
        let c = merge(&args, file).unwrap();
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
        let c = merge(&ServeArgs::default(), file).unwrap();
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
        assert!(merge(&ServeArgs::default(), bad).is_err());
        assert!(toml::from_str::<FileConfig>("[[envs]]\nname = 'x'\nsize = 2").is_err());
    }

    #[test]
    fn the_disk_quota_is_global_or_per_env() {
        let c = merge(&ServeArgs::default(), FileConfig::default()).unwrap();
        assert_eq!(c.sandbox.disk_bytes, 256 << 20);
        let file: FileConfig = toml::from_str(
            "disk_bytes = 67108864\n[[envs]]\nname = 'a'\n[[envs]]\nname = 'b'\ndisk_bytes = 2097152",
        )
        .unwrap();
        let c = merge(&ServeArgs::default(), file).unwrap();
        assert_eq!(c.sandbox.disk_bytes, 64 << 20);
        assert_eq!(c.envs[0].disk_bytes, 64 << 20);
        assert_eq!(c.envs[1].disk_bytes, 2 << 20);
        for text in ["disk_bytes = 1000", "[[envs]]\nname = 'a'\ndisk_bytes = 0"] {
            let file: FileConfig = toml::from_str(text).unwrap();
            let err = merge(&ServeArgs::default(), file).unwrap_err();
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
        let c = merge(&args, file).unwrap();
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
        let err = merge(&ServeArgs::default(), file).unwrap_err();
        assert!(err.to_string().contains("pool_size"), "{err}");
    }

    #[test]
    fn the_default_env_comes_from_the_highest_source_that_names_one() {
        let file = || -> FileConfig { toml::from_str("conda_prefix = '/from/file'").unwrap() };
        let host = |vars: EnvVars| HostEnv {
            env_vars: vars,
            ..HostEnv::default()
        };
        let all_vars = EnvVars {
            conda_env: Some("var-env".into()),
            conda_prefix: Some("/var/prefix".into()),
            python: Some("/var/python".into()),
            conda_env_name: Some("seed-env".into()),
        };
        let choice = |args: &ServeArgs, vars: EnvVars| {
            Config::merge_with(args, file(), host(vars)).unwrap().env
        };
        let flag = ServeArgs {
            python: Some("/flag/python".into()),
            ..Default::default()
        };
        // 1. a flag, whatever the variables say (no clap conflict either).
        assert_eq!(
            choice(&flag, all_vars.clone()),
            EnvChoice::Python("/flag/python".into())
        );
        let none = ServeArgs::default();
        // 2. CODE_EXECUTOR_* variables, the most specific first.
        assert_eq!(
            choice(&none, all_vars.clone()),
            EnvChoice::CondaEnv("var-env".into())
        );
        let image_and_user = EnvVars {
            conda_prefix: Some("/var/prefix".into()),
            python: Some("/var/python".into()),
            ..EnvVars::default()
        };
        assert_eq!(
            choice(&none, image_and_user),
            EnvChoice::CondaPrefix("/var/prefix".into())
        );
        // 3. CONDA_ENV_NAME, below the CODE_EXECUTOR_* variables.
        let seed = EnvVars {
            conda_env_name: Some("target_env".into()),
            ..EnvVars::default()
        };
        assert_eq!(
            choice(&none, seed.clone()),
            EnvChoice::CondaEnv("target_env".into())
        );
        let seed_and_python = EnvVars {
            python: Some("/var/python".into()),
            ..seed
        };
        assert_eq!(
            choice(&none, seed_and_python),
            EnvChoice::Python("/var/python".into())
        );
        // 4. the file; 5. nothing.
        assert_eq!(
            choice(&none, EnvVars::default()),
            EnvChoice::CondaPrefix("/from/file".into())
        );
        let c = Config::merge_with(&none, FileConfig::default(), HostEnv::default()).unwrap();
        assert_eq!(c.env, EnvChoice::Default);
        // Two keys of one file, or two flags built in code, stay an error.
        let two: FileConfig = toml::from_str("conda_env = 'a'\npython = '/b'").unwrap();
        let err = merge(&none, two).unwrap_err().to_string();
        assert!(err.contains("conda_env, conda_prefix and python"), "{err}");
        let two_flags = ServeArgs {
            conda_env: Some("a".into()),
            ..flag
        };
        let err = merge(&two_flags, FileConfig::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--conda-env, --conda-prefix and --python"),
            "{err}"
        );
    }

    #[test]
    fn clap_reads_no_variable_for_the_env_flags_and_refuses_two_flags() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let serve = cli.find_subcommand("serve").unwrap();
        for id in ["conda_env", "conda_prefix", "python"] {
            let arg = serve.get_arguments().find(|a| a.get_id() == id).unwrap();
            assert_eq!(arg.get_env(), None, "--{id} would conflict with a variable");
        }
        let token = serve
            .get_arguments()
            .find(|a| a.get_id() == "token")
            .unwrap();
        assert_eq!(token.get_env().unwrap(), "CODE_EXECUTOR_TOKEN");
        let err = Cli::try_parse_from([
            "code-executor",
            "serve",
            "--conda-env",
            "ml",
            "--python",
            "/usr/bin/python3",
        ])
        .unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn the_system_config_is_read_when_no_file_is_named_and_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let system = write(dir.path(), "config.toml", "pool_size = 3\ntimeout = 7");
        let named = write(dir.path(), "named.toml", "pool_size = 5");
        let host = HostEnv {
            system_config: Some(system),
            ..HostEnv::default()
        };
        let c = Config::load_with(&ServeArgs::default(), host.clone()).unwrap();
        assert_eq!((c.pool_size, c.timeout), (3, 7.0));
        // --config (or CODE_EXECUTOR_CONFIG) replaces it.
        let args = ServeArgs {
            config: Some(named),
            ..Default::default()
        };
        let c = Config::load_with(&args, host).unwrap();
        assert_eq!((c.pool_size, c.timeout), (5, 30.0));
        // Absent, it is no error.
        let host = HostEnv {
            system_config: Some(dir.path().join("missing.toml")),
            ..HostEnv::default()
        };
        let c = Config::load_with(&ServeArgs::default(), host).unwrap();
        assert_eq!(c.pool_size, 4);
        // A named file that is missing is one.
        let args = ServeArgs {
            config: Some(dir.path().join("missing.toml")),
            ..Default::default()
        };
        let err = Config::load_with(&args, HostEnv::default()).unwrap_err();
        assert!(
            err.to_string().starts_with("error reading config file"),
            "{err}"
        );
    }

    #[test]
    fn the_defaults_file_lies_beneath_the_config_file_and_the_flags() {
        let dir = tempfile::tempdir().unwrap();
        let defaults = write(
            dir.path(),
            "defaults.toml",
            "host = '0.0.0.0'\npool_size = 2\ntimeout = 9\ninsecure_no_auth = true",
        );
        let config = write(dir.path(), "config.toml", "pool_size = 5");
        let host = HostEnv {
            system_config: Some(config),
            defaults_file: Some(defaults),
            ..HostEnv::default()
        };
        let args = ServeArgs {
            timeout: Some(1.5),
            ..Default::default()
        };
        let c = Config::load_with(&args, host.clone()).unwrap();
        assert_eq!(c.host.to_string(), "0.0.0.0", "from the defaults");
        assert_eq!(c.pool_size, 5, "the config file wins over the defaults");
        assert_eq!(c.timeout, 1.5, "a flag wins over both");
        // An error in the defaults names that file and its line.
        let bad = write(dir.path(), "bad.toml", "host = '0.0.0.0'\npool = 2");
        let host = HostEnv {
            defaults_file: Some(bad),
            ..host
        };
        let err = Config::load_with(&args, host).unwrap_err().to_string();
        assert!(err.contains("bad.toml: line 2, column 1"), "{err}");
    }

    #[test]
    fn beyond_loopback_without_a_token_one_is_generated() {
        let wide = ServeArgs {
            host: Some("0.0.0.0".parse().unwrap()),
            ..Default::default()
        };
        let a = merge(&wide, FileConfig::default()).unwrap();
        let b = merge(&wide, FileConfig::default()).unwrap();
        assert!(a.token_generated);
        let token = a.token.as_deref().unwrap();
        assert_eq!(token.len(), 64, "32 bytes in hex: {token}");
        assert!(
            token
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a.token, b.token, "every start makes a new one");
        // A configured token, --insecure-no-auth or loopback: none generated.
        let given = ServeArgs {
            token: Some("mine".into()),
            ..wide.clone()
        };
        let c = merge(&given, FileConfig::default()).unwrap();
        assert_eq!(
            (c.token.as_deref(), c.token_generated),
            (Some("mine"), false)
        );
        let open = ServeArgs {
            insecure_no_auth: true,
            ..wide
        };
        let c = merge(&open, FileConfig::default()).unwrap();
        assert_eq!((c.token, c.token_generated), (None, false));
        let c = merge(&ServeArgs::default(), FileConfig::default()).unwrap();
        assert_eq!((c.token, c.token_generated), (None, false));
    }
}

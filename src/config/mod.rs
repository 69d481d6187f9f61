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
//! environment decides, so an image's variable or defaults file never
//! conflicts with a user's flag or config file. Two flags, or two keys of one
//! file (even one a higher source overrides), are still an error; among the
//! variables the most specific wins (`CODE_EXECUTOR_CONDA_ENV`, then
//! `CODE_EXECUTOR_CONDA_PREFIX`, then `CODE_EXECUTOR_PYTHON`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

use crate::env::RegistryConfig;
use crate::error::ConfigError;
use crate::limits::{RequestLimits, ResultLimits};
use crate::protocol::WireLimits;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Smallest scratch quota: room for the worker's own directories and a run's files.
const MIN_DISK_BYTES: u64 = MIB;

mod options;

pub use options::{OptionDoc, Options, Seconds, option_docs};

pub use crate::artifacts::ArtifactLimits;
pub use crate::egress::EgressLimits;
pub use crate::env::{EnvChoice, EnvConfig, EnvSettings, EnvVars, HostEnv};
pub use crate::sandbox::launch::LaunchArgs;
pub use crate::sandbox::{DEFAULT_DISK_BYTES, Network, SandboxConfig, TierChoice};
pub use crate::session::SessionConfig;

#[derive(Debug, Parser)]
#[command(
    name = "code-executor",
    version,
    about = "Run Python code in warm, isolated workers"
)]
/// The command line.
pub struct Cli {
    #[command(subcommand)]
    /// What to do.
    pub command: Command,
}

#[derive(Debug, Subcommand)]
/// The subcommands.
pub enum Command {
    /// Serve the HTTP API (and MCP over streamable HTTP at /mcp).
    Serve(ServeCommand),
    /// Serve MCP over stdin/stdout (for MCP clients that launch servers).
    Mcp(McpCommand),
    /// Print the environments this server can see.
    Envs(Options),
    /// Print the SHA-256 of a bearer token (the argument, else a line of
    /// stdin), for `token_sha256` in the clients file.
    HashToken(HashTokenCommand),
    /// Internal: start a program inside the worker sandbox (see `sandbox::launch`).
    #[command(hide = true)]
    SandboxExec(LaunchArgs),
}

/// `code-executor serve`.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeCommand {
    #[command(flatten)]
    /// Every option (see [`Options`]).
    pub options: Options,
    /// Validate the configuration, print the environments it resolves to
    /// and exit (0 when valid) without serving.
    #[arg(long)]
    pub check_config: bool,
}

/// `code-executor mcp`.
#[derive(Debug, Clone, Default, Args)]
pub struct McpCommand {
    #[command(flatten)]
    /// Every option (see [`Options`]).
    pub options: Options,
    /// Share one warm server among this user's launches with the same
    /// binary, command line, environment, working directory and config
    /// files: a launch relays to it over a Unix socket, starting it when none
    /// runs.
    #[arg(
        long,
        env = "CODE_EXECUTOR_MCP_SHARED",
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub shared: Option<bool>,
    /// How long a shared server stays after its last client leaves, in
    /// seconds (default 600).
    #[arg(long, env = "CODE_EXECUTOR_MCP_SHARED_IDLE")]
    pub shared_idle: Option<Seconds>,
    /// Internal: serve as the shared server on this socket.
    #[arg(long, hide = true)]
    pub serve_shared: Option<PathBuf>,
}

impl McpCommand {
    /// Whether launches share a server (`--shared`).
    pub fn is_shared(&self) -> bool {
        self.shared == Some(true)
    }

    /// How long a shared server stays after its last client leaves.
    pub fn idle(&self) -> Duration {
        self.shared_idle
            .map_or(Duration::from_secs(600), Seconds::duration)
    }
}

/// `code-executor hash-token`.
#[derive(Debug, Clone, Default, Args)]
pub struct HashTokenCommand {
    /// The token; read from stdin when absent (keeps it out of the shell's
    /// history and the process list).
    pub token: Option<String>,
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

/// One `[[envs]]` table. `prefix` or `python` locate the environment; with
/// neither, `name` names a discovered Conda environment. The other keys
/// override the global settings for this environment.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvTable {
    /// Name in requests; with neither `prefix` nor `python`, the name of a discovered Conda environment.
    pub name: Option<String>,
    /// The environment's prefix (its interpreter is `bin/python`).
    pub prefix: Option<PathBuf>,
    /// Any interpreter; its prefix is asked from it.
    pub python: Option<PathBuf>,
    /// The environment used when a request names none.
    #[serde(default)]
    pub default: bool,
    /// Warm workers of this environment.
    pub pool_size: Option<usize>,
    /// Modules its workers import before they serve.
    pub preload: Option<Vec<String>>,
    /// Whether its workers' zygotes map their memory with huge pages.
    pub huge_pages: Option<bool>,
    /// Default wall-clock timeout of a run, seconds.
    pub timeout: Option<Seconds>,
    /// Largest timeout a request may ask for, seconds.
    pub max_timeout: Option<Seconds>,
    /// Address-space limit of each run, bytes.
    pub memory_bytes: Option<u64>,
    /// Open files of each run.
    pub open_files: Option<u64>,
    /// Largest file a run may write, bytes.
    pub file_size_bytes: Option<u64>,
    /// CPU-time limit of each run, seconds.
    pub cpu_seconds: Option<u64>,
    /// Processes and threads of each run.
    pub processes: Option<u64>,
    /// This env's network (`isolated` or `host`); the global one when absent.
    pub network: Option<Network>,
    /// Hosts this env's runs may reach through the egress proxy; the
    /// global list when absent, none when empty.
    pub allowed_hosts: Option<Vec<String>>,
    /// Size of this env's workers' scratch tmpfs; the global one when absent.
    pub disk_bytes: Option<u64>,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on.
    pub host: IpAddr,
    /// Port to listen on (0 picks a free one).
    pub port: u16,
    /// The default environment.
    pub env: EnvChoice,
    /// Default wall-clock timeout of a run, seconds.
    pub timeout: f64,
    /// Largest timeout a request may ask for, seconds.
    pub max_timeout: f64,
    /// Warm workers per configured environment.
    pub pool_size: usize,
    /// Modules every worker imports before it serves.
    pub preload: Vec<String>,
    /// Bearer token the API asks for (none: open).
    pub token: Option<String>,
    /// `token` was generated at start (none was configured and the address
    /// is not loopback): the server prints it once in its log.
    pub token_generated: bool,
    /// Bearer token `/install` asks for (none: installs are disabled).
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
    pub run_limits: WireLimits,
    /// Hosts runs may reach through the egress proxy (environments without
    /// their own list); empty: none.
    pub allowed_hosts: Vec<String>,
    /// Caps on one run's connections and bytes through the egress proxy.
    pub egress: crate::egress::EgressLimits,
    /// Names the egress proxy resolves without DNS (`network_hosts`).
    pub network_hosts: std::collections::HashMap<String, Vec<std::net::IpAddr>>,
    /// A bootstrap to run instead of the embedded `python/worker.py` (testing aid).
    pub worker_script: Option<PathBuf>,
    /// Where the compiled bootstrap is kept across starts; `None`: not kept.
    pub cache_dir: Option<PathBuf>,
    /// Environments configured one by one (`[[envs]]`); pre-warmed.
    pub envs: Vec<EnvConfig>,
    /// Whether Conda environments are discovered (and served lazily).
    pub discover: bool,
    /// Whether each worker's zygote imports ahead the standard-library
    /// modules its runs keep importing.
    pub learn_imports: bool,
    /// Whether each worker's zygote holds, loaded, the programs its runs
    /// keep running; each run's process then holds them too.
    pub hold_programs: bool,
    /// Whether each worker's zygote maps its memory with transparent huge
    /// pages where it fills whole ones (cheaper forks, more memory).
    pub huge_pages: bool,
    /// Cap on live workers across all pools: keeps many environments from
    /// starting an interpreter each beyond what the machine can hold.
    pub max_workers: usize,
    /// Idle time after which a discovered (unconfigured) env's workers stop.
    pub idle_timeout: Duration,
    /// Bound on one install run.
    pub install_timeout: Duration,
    /// Bound on one create or clone (`POST /envs`).
    pub create_timeout: Duration,
    /// How often what discovery reads is checked for changes; zero: never
    /// (an unknown name still rescans once).
    pub rescan_interval: Duration,
    /// Where `POST /envs` places new environments (else the first writable
    /// `envs_dirs` entry).
    pub envs_dir: Option<PathBuf>,
    /// The `uv` executable (else `uv` on `PATH`).
    pub uv: Option<PathBuf>,
    /// Bound on running an env's activation scripts (and on each Conda query
    /// during discovery).
    pub activation_timeout: Duration,
    /// What discovery reads from the server's environment (PATH, CONDA_EXE,
    /// CONDA_PREFIX, HOME).
    pub host_env: HostEnv,
    /// Bearer token for `/metrics` (else `token` guards it).
    pub metrics_token: Option<String>,
    /// How log lines are written.
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
    /// Every MCP connection gets implicit sessions, one per environment its
    /// calls name, closed with it.
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
    /// The audit log: where, fail open or closed, with code or not.
    pub audit: crate::audit::AuditConfig,
    /// The clients file (named clients), re-read on SIGHUP.
    pub clients_file: Option<PathBuf>,
    /// The client MCP over stdio acts as (by name).
    pub mcp_client: Option<String>,
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
            run_limits: WireLimits {
                cpu_seconds: None,
                memory_bytes: Some(2 * GIB),
                file_size_bytes: Some(GIB),
                open_files: Some(1024),
                processes: None,
                // A request's own; the env's scratch tmpfs is `disk_bytes`.
                disk_bytes: None,
            },
            worker_script: None,
            cache_dir: crate::worker::default_cache_dir(),
            allowed_hosts: Vec::new(),
            egress: crate::egress::EgressLimits::default(),
            network_hosts: std::collections::HashMap::new(),
            envs: Vec::new(),
            discover: true,
            learn_imports: true,
            hold_programs: false,
            huge_pages: false,
            max_workers: 32,
            idle_timeout: Duration::from_secs(300),
            install_timeout: Duration::from_secs(600),
            create_timeout: Duration::from_secs(1800),
            rescan_interval: Duration::from_secs(3),
            envs_dir: None,
            uv: None,
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
            audit: crate::audit::AuditConfig {
                queue: crate::audit::DEFAULT_QUEUE,
                ..crate::audit::AuditConfig::default()
            },
            clients_file: None,
            mcp_client: None,
        }
    }
}

impl Config {
    /// Merge flags, the process's variables, the config file and the
    /// defaults (see the module docs for the order).
    pub fn load(args: &Options) -> Result<Config, ConfigError> {
        Config::load_with(args, HostEnv::from_process())
    }

    /// [`Config::load`] with `host` standing for the process's environment:
    /// the config file is `--config`, else `host.system_config` when it
    /// exists, laid over `host.defaults_file`.
    pub fn load_with(args: &Options, host: HostEnv) -> Result<Config, ConfigError> {
        let path = args
            .config
            .clone()
            .or_else(|| host.system_config.clone().filter(|p| p.exists()));
        let defaults = match &host.defaults_file {
            Some(defaults) => read_file(defaults)?,
            None => Options::default(),
        };
        let file = match &path {
            Some(path) => {
                let file = read_file(path)?;
                let mut defaults = defaults;
                if file.names_env() {
                    // The default environment is one choice, not three
                    // keys: the config file's, made with any of them, hides
                    // the defaults file's.
                    (defaults.conda_env, defaults.conda_prefix, defaults.python) =
                        (None, None, None);
                }
                file.or(defaults)
            }
            None => defaults,
        };
        Config::merge_with(args, file, host)
    }

    /// The files [`Config::load`] would read for `args`: the config file
    /// (if any), then the defaults file (if named).
    pub fn files(args: &Options) -> Vec<PathBuf> {
        let host = HostEnv::from_process();
        let path = args
            .config
            .clone()
            .or_else(|| host.system_config.clone().filter(|p| p.exists()));
        path.into_iter().chain(host.defaults_file).collect()
    }

    /// Merge flags, `file` and the defaults, with the process's variables.
    pub fn merge(args: &Options, file: Options) -> Result<Config, ConfigError> {
        Config::merge_with(args, file, HostEnv::from_process())
    }

    /// Merge flags (and the variables clap read into them), the variables
    /// of `host` that choose the default environment, `file` and the
    /// defaults.
    pub fn merge_with(
        args: &Options,
        mut file: Options,
        host: HostEnv,
    ) -> Result<Config, ConfigError> {
        let d = Config::default();
        let secs = |v: Option<Seconds>, default: Duration| v.map_or(default, Seconds::duration);
        let env = choose_env(args, &host.env_vars, &mut file)?;
        let o = args.clone().or(file);
        let timeout = o.timeout.map_or(d.timeout, Seconds::get);
        let max_timeout = o.max_timeout.map_or(d.max_timeout, Seconds::get);
        let pool_size = o.pool_size.unwrap_or(d.pool_size);
        let preload = o.preload.unwrap_or_default();
        let huge_pages = o.huge_pages.unwrap_or(d.huge_pages);
        let run_limits = WireLimits {
            memory_bytes: o.memory_bytes.or(d.run_limits.memory_bytes),
            file_size_bytes: o.file_size_bytes.or(d.run_limits.file_size_bytes),
            open_files: o.open_files.or(d.run_limits.open_files),
            cpu_seconds: o.cpu_seconds.or(d.run_limits.cpu_seconds),
            processes: o.processes.or(d.run_limits.processes),
            disk_bytes: None,
        };
        let network = o.network.unwrap_or_default();
        let disk_bytes = o.disk_bytes.unwrap_or(d.sandbox.disk_bytes);
        let allowed_hosts = o.allowed_hosts.clone().unwrap_or_default();
        let network_hosts = parse_network_hosts(o.network_hosts.as_deref().unwrap_or_default())?;
        let envs = o
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
                    settings: EnvSettings {
                        pool_size: t.pool_size.unwrap_or(pool_size),
                        preload: t.preload.unwrap_or_else(|| preload.clone()),
                        huge_pages: t.huge_pages.unwrap_or(huge_pages),
                        timeout: t.timeout.map_or(timeout, Seconds::get),
                        max_timeout: t.max_timeout.map_or(max_timeout, Seconds::get),
                        run_limits: WireLimits {
                            memory_bytes: t.memory_bytes.or(run_limits.memory_bytes),
                            file_size_bytes: t.file_size_bytes.or(run_limits.file_size_bytes),
                            open_files: t.open_files.or(run_limits.open_files),
                            cpu_seconds: t.cpu_seconds.or(run_limits.cpu_seconds),
                            processes: t.processes.or(run_limits.processes),
                            disk_bytes: None,
                        },
                        network: t.network.unwrap_or(network),
                        allowed_hosts: t.allowed_hosts.unwrap_or_else(|| allowed_hosts.clone()),
                        disk_bytes: t.disk_bytes.unwrap_or(disk_bytes),
                    },
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let token = |t: Option<String>| t.filter(|t| !t.is_empty());
        let mut config = Config {
            host: o.host.unwrap_or(d.host),
            port: o.port.unwrap_or(d.port),
            env,
            timeout,
            max_timeout,
            pool_size,
            preload,
            token: token(o.token),
            token_generated: false,
            admin_token: token(o.admin_token),
            queue_timeout: secs(o.queue_timeout_secs, d.queue_timeout),
            max_runs: o.max_runs.unwrap_or(d.max_runs),
            max_output_bytes: o.max_output_bytes.unwrap_or(d.max_output_bytes),
            results: ResultLimits {
                max_artifact_bytes: o.max_artifact_bytes.unwrap_or(d.results.max_artifact_bytes),
                max_artifacts_bytes: o
                    .max_artifacts_bytes
                    .unwrap_or(d.results.max_artifacts_bytes),
                max_result_chars: o.max_result_chars.unwrap_or(d.results.max_result_chars),
            },
            max_body_bytes: o.max_body_bytes.unwrap_or(d.max_body_bytes),
            worker_start_timeout: secs(o.worker_start_timeout_secs, d.worker_start_timeout),
            grace_period: secs(o.grace_period_secs, d.grace_period),
            shutdown_timeout: secs(o.shutdown_timeout_secs, d.shutdown_timeout),
            run_limits,
            allowed_hosts,
            egress: crate::egress::EgressLimits {
                max_connections: o
                    .network_max_connections
                    .unwrap_or(d.egress.max_connections),
                max_bytes: o.network_max_bytes.unwrap_or(d.egress.max_bytes),
                idle_timeout: secs(o.network_idle_timeout_secs, d.egress.idle_timeout),
            },
            network_hosts,
            sandbox: SandboxConfig {
                enabled: o.sandbox.unwrap_or(d.sandbox.enabled),
                launcher: o.launcher,
                network,
                landlock: o.landlock.unwrap_or(d.sandbox.landlock),
                run_as: o.run_as,
                run_as_group: o.run_as_group,
                disk_bytes,
                tier: o.sandbox_tier.unwrap_or_default(),
            },
            insecure_no_auth: o.insecure_no_auth.unwrap_or(false),
            request_limits: RequestLimits {
                max_code_bytes: o.max_code_bytes.unwrap_or(d.request_limits.max_code_bytes),
                max_files: o.max_files.unwrap_or(d.request_limits.max_files),
                max_files_bytes: o
                    .max_files_bytes
                    .unwrap_or(d.request_limits.max_files_bytes),
            },
            worker_script: o.worker_script,
            cache_dir: match o.cache_dir {
                Some(dir) if dir.as_os_str() == "none" => None,
                Some(dir) => Some(dir),
                None => d.cache_dir,
            },
            envs,
            discover: o.discover.unwrap_or(d.discover),
            learn_imports: o.learn_imports.unwrap_or(d.learn_imports),
            hold_programs: o.hold_programs.unwrap_or(d.hold_programs),
            huge_pages,
            max_workers: o.max_workers.unwrap_or(d.max_workers),
            idle_timeout: secs(o.idle_timeout_secs, d.idle_timeout),
            install_timeout: secs(o.install_timeout_secs, d.install_timeout),
            create_timeout: secs(o.create_timeout_secs, d.create_timeout),
            rescan_interval: secs(o.rescan_interval_secs, d.rescan_interval),
            envs_dir: o.envs_dir,
            uv: o.uv,
            activation_timeout: secs(o.activation_timeout_secs, d.activation_timeout),
            host_env: host,
            metrics_token: token(o.metrics_token),
            log_format: o.log_format.unwrap_or(d.log_format),
            max_grade_cases: o.max_grade_cases.unwrap_or(d.max_grade_cases),
            sessions: SessionConfig {
                ttl: secs(o.session_ttl_secs, d.sessions.ttl),
                max_ttl: secs(o.max_session_ttl_secs, d.sessions.max_ttl),
                max_sessions: o.max_sessions.unwrap_or(d.sessions.max_sessions),
                max_sessions_per_env: o
                    .max_sessions_per_env
                    .unwrap_or(d.sessions.max_sessions_per_env),
                interrupt_grace: secs(o.session_interrupt_grace_secs, d.sessions.interrupt_grace),
                keep_worker: secs(o.session_keep_worker_secs, d.sessions.keep_worker),
            },
            mcp_implicit_session: o.mcp_implicit_session.unwrap_or(d.mcp_implicit_session),
            artifacts: crate::artifacts::ArtifactLimits {
                ttl: secs(o.artifact_ttl_secs, d.artifacts.ttl),
                max_bytes: o.artifact_store_bytes.unwrap_or(d.artifacts.max_bytes),
                max_owner_bytes: o
                    .artifact_owner_bytes
                    .unwrap_or(d.artifacts.max_owner_bytes),
            },
            mcp_max_artifact_bytes: o.mcp_max_artifact_bytes.unwrap_or(d.mcp_max_artifact_bytes),
            mcp_inline_image_bytes: o.mcp_inline_image_bytes.unwrap_or(d.mcp_inline_image_bytes),
            max_image_pixels: o.max_image_pixels.unwrap_or(d.max_image_pixels),
            connections: ConnectionLimits {
                header_read_timeout: secs(
                    o.header_read_timeout_secs,
                    d.connections.header_read_timeout,
                ),
                body_read_timeout: secs(o.body_read_timeout_secs, d.connections.body_read_timeout),
                max_connections: o.max_connections.unwrap_or(d.connections.max_connections),
            },
            replica_id: o
                .replica_id
                .filter(|id| !id.is_empty())
                .unwrap_or(d.replica_id),
            drain_delay: secs(o.drain_delay_secs, d.drain_delay),
            audit: crate::audit::AuditConfig {
                target: o.audit_log.as_deref().map(crate::audit::AuditTarget::parse),
                fail: o.audit_fail.unwrap_or_default(),
                include_code: o.audit_include_code.unwrap_or(false),
                queue: o.audit_queue.unwrap_or(d.audit.queue),
                max_bytes: o.audit_max_bytes,
            },
            clients_file: o.clients,
            mcp_client: o.mcp_client.filter(|c| !c.is_empty()),
        };
        config.validate()?;
        // As Jupyter does: beyond loopback, a server nobody gave a token
        // makes its own (printed once in the log) rather than refusing to
        // start; only --insecure-no-auth serves without one.
        if !config.host.is_loopback()
            && config.token.is_none()
            && config.clients_file.is_none()
            && !config.insecure_no_auth
        {
            config.token = Some(random_token().map_err(ConfigError::Token)?);
            config.token_generated = true;
        }
        Ok(config)
    }

    /// The defaults every environment starts from: the global settings.
    pub fn env_defaults(&self) -> EnvSettings {
        EnvSettings {
            pool_size: self.pool_size,
            preload: self.preload.clone(),
            huge_pages: self.huge_pages,
            timeout: self.timeout,
            max_timeout: self.max_timeout,
            run_limits: self.run_limits.clone(),
            network: self.sandbox.network,
            allowed_hosts: self.allowed_hosts.clone(),
            disk_bytes: self.sandbox.disk_bytes,
        }
    }

    /// The environments this configuration resolves to, as
    /// `code-executor envs` prints them: name, kind, Python version,
    /// default, prefix.
    pub async fn describe_envs(&self) -> Result<String, ConfigError> {
        let registry = crate::env::Registry::build(&self.registry()).await?;
        for clash in &registry.clashes {
            clash.warn();
        }
        Ok(registry.describe().await)
    }

    /// What building the environment registry reads.
    pub fn registry(&self) -> RegistryConfig<'_> {
        RegistryConfig {
            host: &self.host_env,
            discover: self.discover,
            query_timeout: self.activation_timeout,
            env: &self.env,
            defaults: self.env_defaults(),
            envs: &self.envs,
            max_workers: self.max_workers,
        }
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
                crate::limits::readable(self.timeout)
            )));
        }
        if self.timeout > self.max_timeout {
            return Err(ConfigError::Invalid(format!(
                "timeout {} exceeds max_timeout {}",
                crate::limits::readable(self.timeout),
                crate::limits::readable(self.max_timeout)
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
        check_allowed_hosts("", &self.env_defaults())?;
        for env in &self.envs {
            let name = env.name.as_deref().unwrap_or("(unnamed)");
            check_allowed_hosts(&format!("[[envs]] {name}: "), &env.settings)?;
            let settings = &env.settings;
            if settings.disk_bytes < MIN_DISK_BYTES {
                return Err(ConfigError::Invalid(format!(
                    "[[envs]] {name}: disk_bytes must be at least {MIN_DISK_BYTES} (1 MiB)"
                )));
            }
            if settings.pool_size == 0 {
                return Err(ConfigError::Invalid(format!(
                    "[[envs]] {name}: pool_size must be at least 1"
                )));
            }
            if !(settings.timeout > 0.0 && settings.timeout <= settings.max_timeout) {
                return Err(ConfigError::Invalid(format!(
                    "[[envs]] {name}: timeout must be positive and at most max_timeout"
                )));
            }
        }
        let least = Duration::from_secs_f64(crate::limits::MIN_SESSION_TTL);
        if self.sessions.ttl < least || self.sessions.ttl > self.sessions.max_ttl {
            return Err(ConfigError::Invalid(format!(
                "session_ttl_secs must be at least {} (session times are kept to the millisecond) \
                 and at most max_session_ttl_secs ({} s), got {}",
                crate::limits::MIN_SESSION_TTL,
                crate::limits::readable(self.sessions.max_ttl.as_secs_f64()),
                crate::limits::readable(self.sessions.ttl.as_secs_f64())
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

/// An environment's `allowed_hosts` parse, and go with an isolated network.
fn check_allowed_hosts(what: &str, settings: &EnvSettings) -> Result<(), ConfigError> {
    if settings.allowed_hosts.is_empty() {
        return Ok(());
    }
    crate::egress::Policy::parse(&settings.allowed_hosts)
        .map_err(|e| ConfigError::Invalid(format!("{what}{e}")))?;
    if settings.network == Network::Host {
        return Err(ConfigError::Invalid(format!(
            "{what}allowed_hosts needs network = \"isolated\": with the host's network the runs reach everything anyway"
        )));
    }
    Ok(())
}

/// `network_hosts` entries, `NAME=IP`.
fn parse_network_hosts(
    entries: &[String],
) -> Result<std::collections::HashMap<String, Vec<std::net::IpAddr>>, ConfigError> {
    let mut hosts: std::collections::HashMap<String, Vec<std::net::IpAddr>> =
        std::collections::HashMap::new();
    for entry in entries {
        let parsed = entry
            .split_once('=')
            .and_then(|(name, ip)| Some((name.trim(), ip.trim().parse().ok()?)))
            .filter(|(name, _)| !name.is_empty());
        let Some((name, ip)) = parsed else {
            return Err(ConfigError::Invalid(format!(
                "network_hosts entry {entry:?} is not NAME=IP"
            )));
        };
        hosts
            .entry(name.trim_end_matches('.').to_ascii_lowercase())
            .or_default()
            .push(ip);
    }
    Ok(hosts)
}

/// The default environment, from the highest source that names one: flags,
/// `CODE_EXECUTOR_*` variables (the most specific first), `CONDA_ENV_NAME`,
/// the file; else [`EnvChoice::Default`].
fn choose_env(
    args: &Options,
    vars: &EnvVars,
    file: &mut Options,
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
    // clap refuses two flags already; options built in code are checked too.
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

/// A TOML config file's options; an error names its file, line and column.
/// A file that names the default environment twice (two of `conda_env`,
/// `conda_prefix`, `python`) is an error of its own, whatever ranks above.
fn read_file(path: &Path) -> Result<Options, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file = parse_file(&text).map_err(|message| ConfigError::Parse {
        path: path.to_path_buf(),
        message,
    })?;
    let named = [
        file.conda_env.is_some(),
        file.conda_prefix.is_some(),
        file.python.is_some(),
    ];
    if named.iter().filter(|n| **n).count() > 1 {
        return Err(ConfigError::Parse {
            path: path.to_path_buf(),
            message: "conda_env, conda_prefix and python each name an environment; give one".into(),
        });
    }
    Ok(file)
}

/// Parse a TOML config; an error names its line and column
/// (`line 3, column 1: unknown field ...`).
pub fn parse_file(text: &str) -> Result<Options, String> {
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
    fn merge(args: &Options, file: Options) -> Result<Config, ConfigError> {
        Config::merge_with(args, file, HostEnv::default())
    }

    #[test]
    fn the_bootstrap_cache_is_a_folder_or_none() {
        let dir = |text: &str| merge(&Options::default(), toml::from_str(text).unwrap()).unwrap();
        assert_eq!(dir("cache_dir = \"none\"").cache_dir, None);
        assert_eq!(
            dir("cache_dir = \"/var/cache/ce\"").cache_dir,
            Some(PathBuf::from("/var/cache/ce"))
        );
        assert_eq!(dir("").cache_dir, crate::worker::default_cache_dir());
    }

    #[test]
    fn programs_are_held_only_when_asked_for() {
        let file = |text: &str| merge(&Options::default(), toml::from_str(text).unwrap()).unwrap();
        assert!(!file("").hold_programs);
        assert!(file("hold_programs = true").hold_programs);
        let args = Options {
            hold_programs: Some(false),
            ..Default::default()
        };
        let c = merge(&args, toml::from_str("hold_programs = true").unwrap()).unwrap();
        assert!(!c.hold_programs, "the flag wins over the file");
    }

    #[test]
    fn huge_pages_are_off_unless_asked_for() {
        let file = |text: &str| merge(&Options::default(), toml::from_str(text).unwrap()).unwrap();
        assert!(!file("").huge_pages);
        assert!(file("huge_pages = true").huge_pages);
        let args = Options {
            huge_pages: Some(false),
            ..Default::default()
        };
        let c = merge(&args, toml::from_str("huge_pages = true").unwrap()).unwrap();
        assert!(!c.huge_pages, "the flag wins over the file");
        // Per environment: an `[[envs]]` table's own, else the global one.
        let c = file(
            "huge_pages = true\n[[envs]]\nname = \"ml\"\n\
             [[envs]]\nname = \"tools\"\nhuge_pages = false",
        );
        assert!(c.env_defaults().huge_pages);
        assert!(c.envs[0].settings.huge_pages);
        assert!(!c.envs[1].settings.huge_pages);
        let c = file("[[envs]]\nname = \"ml\"\nhuge_pages = true");
        assert!(!c.env_defaults().huge_pages && c.envs[0].settings.huge_pages);
    }

    #[test]
    fn flags_win_over_the_file() {
        let file: Options = toml::from_str("port = 9000\npool_size = 3\ntimeout = 5").unwrap();
        let args = Options {
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
        let file: Options = toml::from_str(
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
        let c = merge(&Options::default(), file).unwrap();
        assert_eq!(c.envs.len(), 2);
        assert_eq!(c.envs[0].location, EnvChoice::CondaEnv("ml".into()));
        assert_eq!(c.envs[0].settings.pool_size, 1);
        assert_eq!(c.envs[0].settings.preload, vec!["json".to_string()]);
        assert_eq!(c.envs[0].settings.run_limits.memory_bytes, Some(1024));
        assert_eq!(c.envs[0].settings.timeout, 5.0);
        assert_eq!(c.envs[1].settings.pool_size, 3);
        assert!(c.envs[1].default);
        assert_eq!(
            c.envs[1].location,
            EnvChoice::CondaPrefix("/opt/envs/tools".into())
        );
        let bad: Options = toml::from_str("[[envs]]\npool_size = 2").unwrap();
        assert!(merge(&Options::default(), bad).is_err());
        assert!(toml::from_str::<Options>("[[envs]]\nname = 'x'\nsize = 2").is_err());
    }

    #[test]
    fn the_disk_quota_is_global_or_per_env() {
        let c = merge(&Options::default(), Options::default()).unwrap();
        assert_eq!(c.sandbox.disk_bytes, 256 << 20);
        let file: Options = toml::from_str(
            "disk_bytes = 67108864\n[[envs]]\nname = 'a'\n[[envs]]\nname = 'b'\ndisk_bytes = 2097152",
        )
        .unwrap();
        let c = merge(&Options::default(), file).unwrap();
        assert_eq!(c.sandbox.disk_bytes, 64 << 20);
        assert_eq!(c.envs[0].settings.disk_bytes, 64 << 20);
        assert_eq!(c.envs[1].settings.disk_bytes, 2 << 20);
        for text in ["disk_bytes = 1000", "[[envs]]\nname = 'a'\ndisk_bytes = 0"] {
            let file: Options = toml::from_str(text).unwrap();
            let err = merge(&Options::default(), file).unwrap_err();
            assert!(err.to_string().contains("disk_bytes"), "{err}");
        }
    }

    #[test]
    fn an_env_flag_replaces_the_files_choice() {
        let file: Options = toml::from_str("python = '/usr/bin/python3'").unwrap();
        let args = Options {
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
    fn a_session_ttl_is_at_least_a_millisecond_and_at_most_the_cap() {
        for (text, got) in [
            ("session_ttl_secs = 0.0001", "got 0.0001"),
            ("session_ttl_secs = 0", "got 0"),
            ("max_session_ttl_secs = 0.0005", "(0.0005 s), got 600"),
            (
                "session_ttl_secs = 10\nmax_session_ttl_secs = 5",
                "(5 s), got 10",
            ),
        ] {
            let file: Options = toml::from_str(text).unwrap();
            let err = merge(&Options::default(), file).unwrap_err().to_string();
            assert!(
                err.contains("session_ttl_secs must be at least 0.001") && err.ends_with(got),
                "{text}: {err}"
            );
        }
        let file: Options =
            toml::from_str("session_ttl_secs = 0.001\nmax_session_ttl_secs = 0.001").unwrap();
        let c = merge(&Options::default(), file).unwrap();
        assert_eq!(c.sessions.ttl, Duration::from_millis(1));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        assert!(toml::from_str::<Options>("prot = 1").is_err());
        let file: Options = toml::from_str("pool_size = 0").unwrap();
        let err = merge(&Options::default(), file).unwrap_err();
        assert!(err.to_string().contains("pool_size"), "{err}");
    }

    #[test]
    fn the_default_env_comes_from_the_highest_source_that_names_one() {
        let file = || -> Options { toml::from_str("conda_prefix = '/from/file'").unwrap() };
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
        let choice = |args: &Options, vars: EnvVars| {
            Config::merge_with(args, file(), host(vars)).unwrap().env
        };
        let flag = Options {
            python: Some("/flag/python".into()),
            ..Default::default()
        };
        // 1. a flag, whatever the variables say (no clap conflict either).
        assert_eq!(
            choice(&flag, all_vars.clone()),
            EnvChoice::Python("/flag/python".into())
        );
        let none = Options::default();
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
        let c = Config::merge_with(&none, Options::default(), HostEnv::default()).unwrap();
        assert_eq!(c.env, EnvChoice::Default);
        // Two keys of one file, or two flags built in code, stay an error.
        let two: Options = toml::from_str("conda_env = 'a'\npython = '/b'").unwrap();
        let err = merge(&none, two).unwrap_err().to_string();
        assert!(err.contains("conda_env, conda_prefix and python"), "{err}");
        let two_flags = Options {
            conda_env: Some("a".into()),
            ..flag
        };
        let err = merge(&two_flags, Options::default())
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
        let c = Config::load_with(&Options::default(), host.clone()).unwrap();
        assert_eq!((c.pool_size, c.timeout), (3, 7.0));
        // --config (or CODE_EXECUTOR_CONFIG) replaces it.
        let args = Options {
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
        let c = Config::load_with(&Options::default(), host).unwrap();
        assert_eq!(c.pool_size, 4);
        // A named file that is missing is one.
        let args = Options {
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
        let args = Options {
            timeout: Some("1.5".parse().unwrap()),
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
    fn the_config_files_env_ranks_above_the_defaults_files_whatever_key_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let defaults = write(
            dir.path(),
            "defaults.toml",
            "python = '/usr/bin/python3'\npool_size = 2",
        );
        let host = |config: &Path| HostEnv {
            system_config: Some(config.to_path_buf()),
            defaults_file: Some(defaults.clone()),
            ..HostEnv::default()
        };
        let none = Options::default();
        let prefix = write(dir.path(), "prefix.toml", "conda_prefix = '/some/env'");
        let c = Config::load_with(&none, host(&prefix)).unwrap();
        assert_eq!(c.env, EnvChoice::CondaPrefix("/some/env".into()));
        assert_eq!(c.pool_size, 2, "the defaults' other keys still count");
        let named = write(dir.path(), "named.toml", "conda_env = 'ml'");
        let c = Config::load_with(&none, host(&named)).unwrap();
        assert_eq!(c.env, EnvChoice::CondaEnv("ml".into()));
        // A config file that names none leaves the defaults' choice.
        let quiet = write(dir.path(), "quiet.toml", "pool_size = 3");
        let c = Config::load_with(&none, host(&quiet)).unwrap();
        assert_eq!(c.env, EnvChoice::Python("/usr/bin/python3".into()));
        // Flags and variables rank above both files.
        let flag = Options {
            conda_env: Some("flagged".into()),
            ..Default::default()
        };
        let c = Config::load_with(&flag, host(&prefix)).unwrap();
        assert_eq!(c.env, EnvChoice::CondaEnv("flagged".into()));
        let variable = HostEnv {
            env_vars: EnvVars {
                python: Some("/var/python".into()),
                ..EnvVars::default()
            },
            ..host(&prefix)
        };
        let c = Config::load_with(&none, variable).unwrap();
        assert_eq!(c.env, EnvChoice::Python("/var/python".into()));
    }

    #[test]
    fn two_env_keys_in_one_file_are_an_error_naming_that_file() {
        let dir = tempfile::tempdir().unwrap();
        let two = write(dir.path(), "two.toml", "conda_env = 'a'\npython = '/b'");
        let one = write(dir.path(), "one.toml", "conda_prefix = '/some/env'");
        let flag = Options {
            conda_env: Some("flagged".into()),
            ..Default::default()
        };
        let cases = [
            (
                "the config file",
                Some(two.clone()),
                None,
                Options::default(),
            ),
            (
                "the defaults file",
                None,
                Some(two.clone()),
                Options::default(),
            ),
            (
                "the defaults under a config file naming one",
                Some(one.clone()),
                Some(two.clone()),
                Options::default(),
            ),
            (
                "the config file under a flag",
                Some(two.clone()),
                None,
                flag,
            ),
        ];
        for (what, config, defaults, args) in cases {
            let host = HostEnv {
                system_config: config,
                defaults_file: defaults,
                ..HostEnv::default()
            };
            let err = Config::load_with(&args, host).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("invalid config file {}: ", two.display()))
                    && err.contains("conda_env, conda_prefix and python each name an environment"),
                "{what}: {err}"
            );
        }
    }

    #[test]
    fn beyond_loopback_without_a_token_one_is_generated() {
        let wide = Options {
            host: Some("0.0.0.0".parse().unwrap()),
            ..Default::default()
        };
        let a = merge(&wide, Options::default()).unwrap();
        let b = merge(&wide, Options::default()).unwrap();
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
        let given = Options {
            token: Some("mine".into()),
            ..wide.clone()
        };
        let c = merge(&given, Options::default()).unwrap();
        assert_eq!(
            (c.token.as_deref(), c.token_generated),
            (Some("mine"), false)
        );
        let open = Options {
            insecure_no_auth: Some(true),
            ..wide
        };
        let c = merge(&open, Options::default()).unwrap();
        assert_eq!((c.token, c.token_generated), (None, false));
        let c = merge(&Options::default(), Options::default()).unwrap();
        assert_eq!((c.token, c.token_generated), (None, false));
    }
}

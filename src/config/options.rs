//! Every option in one shape. [`Options`] is the command line (each field a
//! flag, most with a `CODE_EXECUTOR_*` variable) and the TOML file (each
//! field a key, under the same name): the sources are layered field by
//! field with [`Options::or`], then resolved into a [`super::Config`].

use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::Args;
use clap::builder::BoolishValueParser;
use serde::Deserialize;

use super::{EnvTable, LogFormat};
use crate::audit::AuditFail;
use crate::sandbox::{Network, TierChoice};

/// A duration in seconds, as every option that is one is given: a
/// non-negative, finite number (`1.5`), checked where it is read.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Seconds(f64);

impl Seconds {
    /// The number of seconds.
    pub fn get(self) -> f64 {
        self.0
    }

    /// As a duration.
    pub fn duration(self) -> Duration {
        // Checked finite and non-negative when made; saturates past u64.
        Duration::try_from_secs_f64(self.0).unwrap_or(Duration::MAX)
    }
}

impl TryFrom<f64> for Seconds {
    type Error = String;

    fn try_from(s: f64) -> Result<Self, String> {
        if s.is_finite() && s >= 0.0 {
            Ok(Seconds(s))
        } else {
            Err(format!("{s} is not a number of seconds"))
        }
    }
}

impl FromStr for Seconds {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let n: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a number of seconds"))?;
        Seconds::try_from(n)
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = f64::deserialize(d)?;
        Seconds::try_from(n).map_err(serde::de::Error::custom)
    }
}

/// Every option, from one source: the command line and its variables, or a
/// TOML file. Absent fields are unset in that source.
///
/// The three options that choose the default environment (`conda_env`,
/// `conda_prefix`, `python`) read no variable here: their variables (and
/// `CONDA_ENV_NAME`) rank below every flag and are read from
/// [`crate::env::HostEnv`], so that an image's variable and a user's flag
/// never conflict.
#[derive(Debug, Clone, Default, Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// TOML configuration file.
    #[arg(long, env = "CODE_EXECUTOR_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "CODE_EXECUTOR_HOST")]
    pub host: Option<IpAddr>,
    /// Port to listen on (0 picks a free one).
    #[arg(long, env = "CODE_EXECUTOR_PORT")]
    pub port: Option<u16>,
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
    /// Look for Conda environments (default true).
    #[arg(long, env = "CODE_EXECUTOR_DISCOVER", value_parser = BoolishValueParser::new())]
    pub discover: Option<bool>,
    /// Default wall-clock timeout of a run, in seconds.
    #[arg(long, env = "CODE_EXECUTOR_TIMEOUT")]
    pub timeout: Option<Seconds>,
    /// Largest timeout a request may ask for, in seconds.
    #[arg(long, env = "CODE_EXECUTOR_MAX_TIMEOUT")]
    pub max_timeout: Option<Seconds>,
    /// Warm workers kept per environment.
    #[arg(long, env = "CODE_EXECUTOR_POOL_SIZE")]
    pub pool_size: Option<usize>,
    /// Modules every worker imports before it serves (comma-separated).
    #[arg(long, env = "CODE_EXECUTOR_PRELOAD", value_delimiter = ',')]
    pub preload: Option<Vec<String>>,
    /// Import ahead, in each worker's zygote, the standard-library modules
    /// its runs keep importing (default true).
    #[arg(long, env = "CODE_EXECUTOR_LEARN_IMPORTS", value_parser = BoolishValueParser::new())]
    pub learn_imports: Option<bool>,
    /// Map each worker's zygote with transparent huge pages where its memory
    /// fills whole 2 MiB pages: cheaper forks and exits where preloads leave
    /// a large heap, for more memory per worker (default false).
    #[arg(long, env = "CODE_EXECUTOR_HUGE_PAGES", value_parser = BoolishValueParser::new())]
    pub huge_pages: Option<bool>,
    /// Have each worker's zygote hold, loaded, the programs its runs keep
    /// running (a /grade call's submission and tests): faster cases, but
    /// every run's process then holds those programs of other runs too
    /// (default false).
    #[arg(long, env = "CODE_EXECUTOR_HOLD_PROGRAMS", value_parser = BoolishValueParser::new())]
    pub hold_programs: Option<bool>,
    /// Bearer token required by /execute, /list-envs and /list-packages.
    #[arg(long, env = "CODE_EXECUTOR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Bearer token required by admin endpoints (/install); without it
    /// installs are disabled.
    #[arg(long, env = "CODE_EXECUTOR_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Bearer token for GET /metrics; without it /metrics takes the API
    /// token (--token), and is open when there is none.
    #[arg(long, env = "CODE_EXECUTOR_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// Allow listening on a non-loopback address without a token.
    #[arg(
        long,
        env = "CODE_EXECUTOR_INSECURE_NO_AUTH",
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = BoolishValueParser::new()
    )]
    pub insecure_no_auth: Option<bool>,
    /// Seconds a request waits for a free worker before `503 busy`.
    #[arg(long, env = "CODE_EXECUTOR_QUEUE_TIMEOUT_SECS")]
    pub queue_timeout_secs: Option<Seconds>,
    /// Runs after which a worker is replaced (0: never).
    #[arg(long, env = "CODE_EXECUTOR_MAX_RUNS")]
    pub max_runs: Option<u64>,
    /// Cap on live workers across all environments.
    #[arg(long, env = "CODE_EXECUTOR_MAX_WORKERS")]
    pub max_workers: Option<usize>,
    /// Seconds after which an idle, unconfigured environment's workers stop.
    #[arg(long = "idle-timeout", env = "CODE_EXECUTOR_IDLE_TIMEOUT")]
    pub idle_timeout_secs: Option<Seconds>,
    /// Bound on a worker's start and handshake (preloads included), seconds.
    #[arg(long, env = "CODE_EXECUTOR_WORKER_START_TIMEOUT_SECS")]
    pub worker_start_timeout_secs: Option<Seconds>,
    /// Seconds between the steps of terminating a worker.
    #[arg(long, env = "CODE_EXECUTOR_GRACE_PERIOD_SECS")]
    pub grace_period_secs: Option<Seconds>,
    /// Seconds shutdown waits for in-flight requests.
    #[arg(long, env = "CODE_EXECUTOR_SHUTDOWN_TIMEOUT_SECS")]
    pub shutdown_timeout_secs: Option<Seconds>,
    /// Bound on running an env's activation scripts (and on each Conda
    /// query during discovery), seconds.
    #[arg(long, env = "CODE_EXECUTOR_ACTIVATION_TIMEOUT_SECS")]
    pub activation_timeout_secs: Option<Seconds>,
    /// Bound on one /install run, in seconds.
    #[arg(long = "install-timeout", env = "CODE_EXECUTOR_INSTALL_TIMEOUT")]
    pub install_timeout_secs: Option<Seconds>,
    /// Seconds between checks of what discovery reads (environments.txt,
    /// envs/ folders, each env's conda-meta/) for new, removed or changed
    /// environments; 0 turns the checks off (an unknown name still rescans
    /// once).
    #[arg(long = "rescan-interval", env = "CODE_EXECUTOR_RESCAN_INTERVAL")]
    pub rescan_interval_secs: Option<Seconds>,
    /// Folder where POST /envs creates environments (default: the first
    /// writable Conda envs_dirs entry).
    #[arg(long, env = "CODE_EXECUTOR_ENVS_DIR")]
    pub envs_dir: Option<PathBuf>,
    /// The uv executable installs with manager "uv" or "auto" run (default:
    /// uv on PATH).
    #[arg(long, env = "CODE_EXECUTOR_UV")]
    pub uv: Option<PathBuf>,
    /// Bound on one POST /envs create or clone, in seconds.
    #[arg(long = "create-timeout", env = "CODE_EXECUTOR_CREATE_TIMEOUT")]
    pub create_timeout_secs: Option<Seconds>,
    /// Bootstrap script to run instead of the embedded one (testing aid).
    #[arg(long, env = "CODE_EXECUTOR_WORKER_SCRIPT")]
    pub worker_script: Option<PathBuf>,
    /// Folder where the workers' compiled bootstrap is kept across starts, so
    /// that a worker starts without compiling it (default:
    /// $XDG_CACHE_HOME/code-executor, else ~/.cache/code-executor); `none`
    /// keeps it for the server's life only.
    #[arg(long, env = "CODE_EXECUTOR_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Address-space limit of every run, bytes.
    #[arg(long, env = "CODE_EXECUTOR_MEMORY_BYTES")]
    pub memory_bytes: Option<u64>,
    /// CPU-time limit of every run, seconds (default: the timeout + 1).
    #[arg(long, env = "CODE_EXECUTOR_CPU_SECONDS")]
    pub cpu_seconds: Option<u64>,
    /// Processes and threads of every run.
    #[arg(long, env = "CODE_EXECUTOR_PROCESSES")]
    pub processes: Option<u64>,
    /// Open files of every run.
    #[arg(long, env = "CODE_EXECUTOR_OPEN_FILES")]
    pub open_files: Option<u64>,
    /// Largest file a run may write, bytes.
    #[arg(long, env = "CODE_EXECUTOR_FILE_SIZE_BYTES")]
    pub file_size_bytes: Option<u64>,
    /// Size of each worker's scratch tmpfs: all its runs' files at once.
    #[arg(long, env = "CODE_EXECUTOR_DISK_BYTES")]
    pub disk_bytes: Option<u64>,
    /// Output kept per stream and run, bytes.
    #[arg(long, env = "CODE_EXECUTOR_MAX_OUTPUT_BYTES")]
    pub max_output_bytes: Option<u64>,
    /// Largest single artifact returned with its content, bytes.
    #[arg(long, env = "CODE_EXECUTOR_MAX_ARTIFACT_BYTES")]
    pub max_artifact_bytes: Option<u64>,
    /// Content of all artifacts of one run together, bytes.
    #[arg(long, env = "CODE_EXECUTOR_MAX_ARTIFACTS_BYTES")]
    pub max_artifacts_bytes: Option<u64>,
    /// Longest `result` repr before it is cut, characters.
    #[arg(long, env = "CODE_EXECUTOR_MAX_RESULT_CHARS")]
    pub max_result_chars: Option<u64>,
    /// Largest request body accepted, bytes.
    #[arg(long, env = "CODE_EXECUTOR_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Bytes of `code` one request may carry.
    #[arg(long, env = "CODE_EXECUTOR_MAX_CODE_BYTES")]
    pub max_code_bytes: Option<usize>,
    /// Entries in `files` one request may carry.
    #[arg(long, env = "CODE_EXECUTOR_MAX_FILES")]
    pub max_files: Option<usize>,
    /// Decoded bytes of all `files` of one request together.
    #[arg(long, env = "CODE_EXECUTOR_MAX_FILES_BYTES")]
    pub max_files_bytes: Option<usize>,
    /// Most test cases one /grade request may carry.
    #[arg(long, env = "CODE_EXECUTOR_MAX_GRADE_CASES")]
    pub max_grade_cases: Option<usize>,
    /// Network of workers: `isolated` (own namespace, loopback only) or `host`.
    #[arg(long, env = "CODE_EXECUTOR_NETWORK")]
    pub network: Option<Network>,
    /// Hosts runs may reach through the egress proxy (comma-separated):
    /// `host`, `host:port`, `*.domain`, an IP address or CIDR block with an
    /// optional `:port`. Empty or absent: no network beyond loopback.
    #[arg(long, env = "CODE_EXECUTOR_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Option<Vec<String>>,
    /// Connections one run may open through the egress proxy.
    #[arg(long, env = "CODE_EXECUTOR_NETWORK_MAX_CONNECTIONS")]
    pub network_max_connections: Option<u64>,
    /// Bytes one run may send, and receive, through the egress proxy.
    #[arg(long, env = "CODE_EXECUTOR_NETWORK_MAX_BYTES")]
    pub network_max_bytes: Option<u64>,
    /// Seconds an egress connection may idle before the proxy closes it.
    #[arg(long, env = "CODE_EXECUTOR_NETWORK_IDLE_TIMEOUT_SECS")]
    pub network_idle_timeout_secs: Option<Seconds>,
    /// Names the egress proxy resolves without DNS, as NAME=IP
    /// (comma-separated); the addresses are checked like resolved ones.
    #[arg(long, env = "CODE_EXECUTOR_NETWORK_HOSTS", value_delimiter = ',')]
    pub network_hosts: Option<Vec<String>>,
    /// Start workers through the sandbox launcher (default true).
    #[arg(long, env = "CODE_EXECUTOR_SANDBOX", value_parser = BoolishValueParser::new())]
    pub sandbox: Option<bool>,
    /// Sandbox tier: `auto` (namespaces where the host can make them, else
    /// the container tier), `namespaces` or `container`.
    #[arg(long, env = "CODE_EXECUTOR_SANDBOX_TIER")]
    pub sandbox_tier: Option<TierChoice>,
    /// Binary with the `sandbox-exec` subcommand (default: this one).
    #[arg(long, env = "CODE_EXECUTOR_LAUNCHER")]
    pub launcher: Option<PathBuf>,
    /// Confine workers' filesystem access with Landlock (default true).
    #[arg(long, env = "CODE_EXECUTOR_LANDLOCK", value_parser = BoolishValueParser::new())]
    pub landlock: Option<bool>,
    /// User (name or uid) workers run as, e.g. `nobody`.
    #[arg(long, env = "CODE_EXECUTOR_RUN_AS")]
    pub run_as: Option<String>,
    /// Group (name or gid) workers run as; default: the user's.
    #[arg(long, env = "CODE_EXECUTOR_RUN_AS_GROUP")]
    pub run_as_group: Option<String>,
    /// Idle time to live of a session, in seconds (renewed by each call that runs).
    #[arg(long = "session-ttl", env = "CODE_EXECUTOR_SESSION_TTL")]
    pub session_ttl_secs: Option<Seconds>,
    /// Longest time to live a session may ask for, seconds.
    #[arg(long, env = "CODE_EXECUTOR_MAX_SESSION_TTL_SECS")]
    pub max_session_ttl_secs: Option<Seconds>,
    /// Cap on live sessions across all environments.
    #[arg(long, env = "CODE_EXECUTOR_MAX_SESSIONS")]
    pub max_sessions: Option<usize>,
    /// Cap on live sessions of one environment.
    #[arg(long, env = "CODE_EXECUTOR_MAX_SESSIONS_PER_ENV")]
    pub max_sessions_per_env: Option<usize>,
    /// Seconds an interrupted session call gets to stop before its session
    /// is killed.
    #[arg(long, env = "CODE_EXECUTOR_SESSION_INTERRUPT_GRACE_SECS")]
    pub session_interrupt_grace_secs: Option<Seconds>,
    /// Seconds a closed session's worker, cleared, is kept for the next
    /// session of its environment (0: it is ended at once).
    #[arg(long, env = "CODE_EXECUTOR_SESSION_KEEP_WORKER_SECS")]
    pub session_keep_worker_secs: Option<Seconds>,
    /// Give every MCP connection implicit sessions, one per environment:
    /// `execute_code` without `session` runs in its environment's.
    #[arg(
        long,
        env = "CODE_EXECUTOR_MCP_IMPLICIT_SESSION",
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = BoolishValueParser::new()
    )]
    pub mcp_implicit_session: Option<bool>,
    /// Seconds MCP runs' artifacts are kept (MCP resources, GET /artifacts).
    #[arg(long, env = "CODE_EXECUTOR_ARTIFACT_TTL_SECS")]
    pub artifact_ttl_secs: Option<Seconds>,
    /// Bytes of artifacts the store keeps across all clients.
    #[arg(long, env = "CODE_EXECUTOR_ARTIFACT_STORE_BYTES")]
    pub artifact_store_bytes: Option<u64>,
    /// Bytes of artifacts the store keeps for one client.
    #[arg(long, env = "CODE_EXECUTOR_ARTIFACT_OWNER_BYTES")]
    pub artifact_owner_bytes: Option<u64>,
    /// Largest artifact (and all of one run's together) an MCP run keeps.
    #[arg(long, env = "CODE_EXECUTOR_MCP_MAX_ARTIFACT_BYTES")]
    pub mcp_max_artifact_bytes: Option<u64>,
    /// Base64 bytes of images one MCP tool result carries inline.
    #[arg(long, env = "CODE_EXECUTOR_MCP_INLINE_IMAGE_BYTES")]
    pub mcp_inline_image_bytes: Option<usize>,
    /// Plots of MCP runs are saved with at most this many pixels.
    #[arg(long, env = "CODE_EXECUTOR_MAX_IMAGE_PIXELS")]
    pub max_image_pixels: Option<u64>,
    /// Seconds a client may take to send a request's headers (and the idle
    /// time of a kept-alive connection).
    #[arg(long, env = "CODE_EXECUTOR_HEADER_READ_TIMEOUT_SECS")]
    pub header_read_timeout_secs: Option<Seconds>,
    /// Seconds a request's body may take to arrive once its headers did.
    #[arg(long, env = "CODE_EXECUTOR_BODY_READ_TIMEOUT_SECS")]
    pub body_read_timeout_secs: Option<Seconds>,
    /// HTTP connections served at once; past it a new one gets 503.
    #[arg(long, env = "CODE_EXECUTOR_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// This replica's name among others behind a load balancer (in /health,
    /// session ids and the x-replica header); default: the host name.
    #[arg(long, env = "CODE_EXECUTOR_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// Seconds /health answers 503 (draining) after SIGTERM, while the
    /// server still serves everything, before it stops accepting.
    #[arg(long = "drain-delay", env = "CODE_EXECUTOR_DRAIN_DELAY")]
    pub drain_delay_secs: Option<Seconds>,
    /// Audit log: a JSON-lines file, or `-` for stderr (see
    /// docs/operations.md); none by default.
    #[arg(long, env = "CODE_EXECUTOR_AUDIT_LOG")]
    pub audit_log: Option<PathBuf>,
    /// When audit records cannot be kept: `open` (serve on, count the drops)
    /// or `closed` (refuse runs with 503 audit_unavailable).
    #[arg(long, env = "CODE_EXECUTOR_AUDIT_FAIL", value_enum)]
    pub audit_fail: Option<AuditFail>,
    /// Audit records carry the code and its output (default false).
    #[arg(long, env = "CODE_EXECUTOR_AUDIT_INCLUDE_CODE", num_args = 0..=1, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub audit_include_code: Option<bool>,
    /// Audit records queued for the writer at most.
    #[arg(long, env = "CODE_EXECUTOR_AUDIT_QUEUE")]
    pub audit_queue: Option<usize>,
    /// Rotate the audit log (PATH to PATH.1) when it grows past this many
    /// bytes; without it, only SIGHUP reopens it (logrotate).
    #[arg(long, env = "CODE_EXECUTOR_AUDIT_MAX_BYTES")]
    pub audit_max_bytes: Option<u64>,
    /// Clients file (TOML, `[[clients]]`): named clients with their token
    /// hashes, scopes, envs and quotas; reloaded on SIGHUP.
    #[arg(long, env = "CODE_EXECUTOR_CLIENTS")]
    pub clients: Option<PathBuf>,
    /// The client (by name) MCP over stdio acts as; default: the admin
    /// client if there is one, else the token's, else anonymous.
    #[arg(long, env = "CODE_EXECUTOR_MCP_CLIENT")]
    pub mcp_client: Option<String>,
    /// Log line format: text (default) or json.
    #[arg(long, env = "CODE_EXECUTOR_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// `[[envs]]` tables: environments configured one by one (file only).
    #[arg(skip)]
    #[serde(default)]
    pub envs: Vec<EnvTable>,
}

/// Field-wise layering: `$name` of `self` where set, else of `lower`.
macro_rules! layer {
    ($self:ident, $lower:ident; $($name:ident),* $(,)?) => {
        Options {
            $($name: $self.$name.or($lower.$name),)*
            // `[[envs]]` come whole from the highest source that has any.
            envs: if $self.envs.is_empty() { $lower.envs } else { $self.envs },
        }
    };
}

impl Options {
    /// Whether these options name the default environment (with any of
    /// `conda_env`, `conda_prefix`, `python`).
    pub(crate) fn names_env(&self) -> bool {
        self.conda_env.is_some() || self.conda_prefix.is_some() || self.python.is_some()
    }

    /// These options over `lower`: each field is this source's where set,
    /// else `lower`'s (`[[envs]]` whole).
    pub fn or(self, lower: Options) -> Options {
        layer!(self, lower;
            config, host, port, conda_env, conda_prefix, python, discover, timeout,
            max_timeout, pool_size, preload, learn_imports, huge_pages, hold_programs, token,
            admin_token,
            metrics_token, insecure_no_auth, queue_timeout_secs, max_runs, max_workers,
            idle_timeout_secs, worker_start_timeout_secs, grace_period_secs,
            shutdown_timeout_secs, activation_timeout_secs, install_timeout_secs,
            rescan_interval_secs, envs_dir, uv, create_timeout_secs,
            worker_script, cache_dir, memory_bytes, cpu_seconds, processes, open_files,
            file_size_bytes, disk_bytes, max_output_bytes, max_artifact_bytes,
            max_artifacts_bytes, max_result_chars, max_body_bytes, max_code_bytes,
            max_files, max_files_bytes, max_grade_cases, network, allowed_hosts,
            network_max_connections, network_max_bytes, network_idle_timeout_secs,
            network_hosts, sandbox,
            sandbox_tier, launcher, landlock, run_as, run_as_group, session_ttl_secs,
            max_session_ttl_secs, max_sessions, max_sessions_per_env,
            session_interrupt_grace_secs, session_keep_worker_secs, mcp_implicit_session,
            artifact_ttl_secs,
            artifact_store_bytes, artifact_owner_bytes, mcp_max_artifact_bytes,
            mcp_inline_image_bytes, max_image_pixels, header_read_timeout_secs,
            body_read_timeout_secs, max_connections, replica_id, drain_delay_secs,
            log_format, audit_log, audit_fail, audit_include_code, audit_queue,
            audit_max_bytes, clients, mcp_client,
        )
    }
}

/// One option as the docs list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionDoc {
    /// The TOML key (`[[envs]]` keys are listed apart).
    pub key: String,
    /// The command-line flag, with its leading dashes.
    pub flag: String,
    /// The environment variable, when the option reads one.
    pub variable: Option<String>,
    /// What it does.
    pub help: String,
}

/// Every option: its key, flag, variable and help, read from the command
/// line's own definition (so the docs can be checked against it).
pub fn option_docs() -> Vec<OptionDoc> {
    let cmd = <Options as Args>::augment_args(clap::Command::new("code-executor"));
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let flag = format!("--{}", a.get_long()?);
            let key = a.get_id().as_str().to_string();
            Some(OptionDoc {
                // `config` names the file itself: no key in it.
                key: if key == "config" { String::new() } else { key },
                flag,
                variable: a.get_env().map(|v| v.to_string_lossy().into_owned()),
                help: a
                    .get_help()
                    .map(|h| h.to_string())
                    .unwrap_or_default()
                    .replace('\n', " "),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_finite_and_not_negative() {
        assert_eq!(
            "1.5".parse::<Seconds>().unwrap().duration(),
            Duration::from_millis(1500)
        );
        for bad in ["-1", "nan", "inf", "soon"] {
            assert!(bad.parse::<Seconds>().is_err(), "{bad}");
        }
        let err = toml::from_str::<Options>("queue_timeout_secs = -2").unwrap_err();
        assert!(err.to_string().contains("not a number of seconds"), "{err}");
    }

    #[test]
    fn a_higher_source_wins_field_by_field() {
        let flags = Options {
            port: Some(1),
            ..Options::default()
        };
        let file: Options = toml::from_str("port = 2\npool_size = 3").unwrap();
        let both = flags.or(file);
        assert_eq!(both.port, Some(1));
        assert_eq!(both.pool_size, Some(3));
    }

    #[test]
    fn every_option_has_a_flag_a_key_and_help() {
        let docs = option_docs();
        assert!(docs.len() > 60, "{}", docs.len());
        for doc in &docs {
            assert!(!doc.help.is_empty(), "{doc:?}");
            if doc.key.is_empty() {
                continue;
            }
            // The key parses in a file.
            let text = format!("{} = {}", doc.key, "\"x\"");
            let err = toml::from_str::<Options>(&text)
                .err()
                .map(|e| e.to_string());
            assert!(
                !err.as_deref().unwrap_or("").contains("unknown field"),
                "{}: {err:?}",
                doc.key
            );
        }
    }
}

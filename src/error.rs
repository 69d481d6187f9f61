//! Typed errors, one enum per layer.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::protocol::FrameError;

/// `err` and its sources, joined: the full reason in one line.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A worker process failed to start, broke the protocol or died.
// Each variant's `#[error]` message says what it is.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("error spawning interpreter {python}")]
    Spawn {
        python: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("interpreter {python} failed to start the worker: {detail}")]
    Startup { python: PathBuf, detail: String },
    #[error("interpreter {python} speaks worker protocol {found}, this server speaks {expected}")]
    Version {
        python: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("worker did not become ready within {0:?}")]
    StartTimeout(Duration),
    /// The worker's process ended (its status, when it was reaped).
    #[error("worker crashed ({})", exited.map_or("it closed its pipes".to_string(), |s| s.to_string()))]
    Crashed {
        exited: Option<std::process::ExitStatus>,
    },
    /// A worker that failed a run is never given another.
    #[error("worker failed an earlier run and is not reused")]
    Poisoned,
    #[error("worker has no run to cancel")]
    NoRunToCancel,
    #[error("worker did not answer within {0:?}")]
    Unresponsive(Duration),
    #[error("worker broke the protocol")]
    Protocol(#[source] FrameError),
    #[error("worker reported an internal error: {0}")]
    Internal(String),
    /// The worker ran nothing: it could not clear what an earlier run left
    /// (the request can go to another worker).
    #[error("{0}")]
    Retired(String),
    #[error("error talking to worker")]
    Io(#[source] io::Error),
    #[error("error making the worker's egress proxy listener")]
    Egress(#[source] io::Error),
    #[error("all {0} workers the server may run are busy and none is idle to retire")]
    AtCapacity(usize),
}

/// Getting a worker from an environment's pool failed.
// Each variant's `#[error]` message says what it is.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("no worker became free within {0:?}")]
    Busy(Duration),
    #[error("environment cannot start workers: {0}")]
    Unavailable(String),
    #[error("pool is closed")]
    Closed,
}

/// Why the executor could not run a request. Front ends map each variant to
/// their own error shape with [`ExecError::code`] and [`ExecError::status`]
/// (the HTTP status and error code, the MCP tool error).
///
/// `BadRequest`, `TooLarge` and `UnknownSession` carry the sentence the
/// client reads: it is composed where the facts are (the field, the limit
/// and its setting, why a session is gone, which replica holds it).
// Each variant's `#[error]` message says what it is.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("{0}")]
    BadRequest(String),
    /// A part of the request is over its configured limit (named in the message).
    #[error("{0}")]
    TooLarge(String),
    #[error("unknown environment {name:?}; known environments: {known}")]
    UnknownEnv { name: String, known: String },
    /// A request named no environment, and the default one was deleted.
    #[error(
        "the default environment {name:?} was deleted: name an environment in `env` (known environments: {known})"
    )]
    DefaultEnvDeleted { name: String, known: String },
    #[error(transparent)]
    Busy(PoolError),
    #[error("environment {env:?} is unavailable: {reason}")]
    EnvUnavailable { env: String, reason: String },
    /// `error`, refusing one part of a request that its message names (a
    /// submission of a batch); its code and status are `error`'s.
    #[error("{part}: {error}")]
    Part { part: String, error: Box<ExecError> },
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error("server is shutting down")]
    ShuttingDown,
    /// The replica is draining: it refuses what would outlive it.
    #[error(
        "replica {replica:?} is draining (shutting down) and starts no new session; retry: another replica will take it"
    )]
    Draining { replica: String },
    /// No session of this id for the caller: `message` says why (it ended,
    /// or it lives on another replica); `create_one` that the way on is a
    /// new session, which the message then ends saying how in the HTTP
    /// API's terms (the MCP front end names its tool instead).
    #[error("{message}{}", if *create_one { "; create one with POST /sessions" } else { "" })]
    UnknownSession { message: String, create_one: bool },
    /// A call in a session asks for what the session fixed when it began
    /// (`field`: `limits` or `network`). The message says how to set it in
    /// the HTTP API's terms (the MCP front end names its tool instead).
    #[error("{}", fixed_by_session(field))]
    FixedBySession { field: &'static str },
    /// A cap on live sessions is reached: the server's (`env` and
    /// `client` are `None`), one environment's or one client's
    /// (`max_sessions` in the clients file).
    #[error("{}", too_many_sessions(env.as_deref(), client.as_deref(), *limit, "(DELETE /sessions/{id})"))]
    TooManySessions {
        env: Option<String>,
        client: Option<String>,
        limit: usize,
    },
    /// The worker's pids cgroup could not be set for the run or session.
    #[error("cannot cap the run's processes in the worker's cgroup")]
    Cgroup(#[source] io::Error),
    #[error("error encoding the request for the worker")]
    Encode(#[source] FrameError),
    #[error("error drawing a session id")]
    SessionId(#[source] io::Error),
    #[error("error running the installer")]
    Installer(#[source] io::Error),
    /// The client may not do this: a scope it lacks or an environment
    /// outside its allow-list (named in the message).
    #[error("{0}")]
    Forbidden(String),
    /// A client's quota (in-flight runs, rate) is spent for now.
    #[error("{message}")]
    TooManyRequests { message: String, retry_after: u64 },
    /// `audit_fail = "closed"` and the audit log cannot take the request's
    /// record: nothing runs.
    #[error("{0}")]
    AuditUnavailable(String),
    /// The request conflicts with the server's state: an environment of
    /// that name exists, or one in use is to be deleted without `force`.
    #[error("{0}")]
    Conflict(String),
    /// Creating an environment failed (a command's exit status or timeout,
    /// in the message); nothing of it is left on disk.
    #[error("{0}")]
    CreateFailed(String),
    #[error("error laying out the environment")]
    EnvFiles(#[source] io::Error),
}

/// The message of [`ExecError::FixedBySession`] in the HTTP API's terms.
fn fixed_by_session(field: &str) -> String {
    match field {
        "limits" => "a session's limits are set when it is created (POST /sessions with limits); \
                     a call cannot change them"
            .into(),
        _ => format!(
            "a session's {field} is set when it is created (POST /sessions with {field}); a call \
             cannot change it"
        ),
    }
}

/// The message of [`ExecError::TooManySessions`], with `close` saying how
/// to close a session in the terms of the client's front end.
pub fn too_many_sessions(
    env: Option<&str>,
    client: Option<&str>,
    limit: usize,
    close: &str,
) -> String {
    let whose = match (env, client) {
        (_, Some(client)) => format!("client {client:?}"),
        (None, None) => "the server".to_string(),
        (Some(env), None) => format!("environment {env:?}"),
    };
    format!(
        "{whose} already runs its maximum of {limit} sessions; close one {close} or wait for one to expire"
    )
}

impl ExecError {
    /// The error's code in an HTTP error body and an MCP error result.
    pub fn code(&self) -> &'static str {
        match self {
            ExecError::Part { error, .. } => error.code(),
            ExecError::BadRequest(_) | ExecError::FixedBySession { .. } => "bad_request",
            ExecError::TooLarge(_) => "too_large",
            ExecError::UnknownEnv { .. } | ExecError::DefaultEnvDeleted { .. } => "unknown_env",
            ExecError::Busy(_) => "busy",
            ExecError::EnvUnavailable { .. } => "env_unavailable",
            ExecError::ShuttingDown => "unavailable",
            ExecError::Draining { .. } => "draining",
            ExecError::UnknownSession { .. } => "unknown_session",
            ExecError::TooManySessions { .. } => "too_many_sessions",
            ExecError::Forbidden(_) => "forbidden",
            ExecError::TooManyRequests { .. } => "too_many_requests",
            ExecError::AuditUnavailable(_) => "audit_unavailable",
            ExecError::Conflict(_) => "conflict",
            ExecError::CreateFailed(_) => "create_failed",
            ExecError::EnvFiles(_)
            | ExecError::Worker(_)
            | ExecError::Cgroup(_)
            | ExecError::Encode(_)
            | ExecError::SessionId(_)
            | ExecError::Installer(_) => "internal",
        }
    }

    /// The HTTP status the error is answered with.
    pub fn status(&self) -> u16 {
        match self {
            ExecError::Part { error, .. } => error.status(),
            ExecError::BadRequest(_) | ExecError::FixedBySession { .. } => 400,
            ExecError::TooLarge(_) => 413,
            ExecError::UnknownEnv { .. }
            | ExecError::DefaultEnvDeleted { .. }
            | ExecError::UnknownSession { .. } => 404,
            ExecError::Forbidden(_) => 403,
            ExecError::TooManySessions { .. } | ExecError::TooManyRequests { .. } => 429,
            ExecError::AuditUnavailable(_) => 503,
            ExecError::Conflict(_) => 409,
            ExecError::CreateFailed(_) => 422,
            ExecError::Busy(_)
            | ExecError::EnvUnavailable { .. }
            | ExecError::ShuttingDown
            | ExecError::Draining { .. } => 503,
            ExecError::Worker(_)
            | ExecError::Cgroup(_)
            | ExecError::Encode(_)
            | ExecError::SessionId(_)
            | ExecError::EnvFiles(_)
            | ExecError::Installer(_) => 500,
        }
    }

    /// Seconds after which a retry may succeed, when one may.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ExecError::Part { error, .. } => error.retry_after(),
            ExecError::Busy(PoolError::Busy(wait)) => Some(wait.as_secs().clamp(1, 60)),
            ExecError::ShuttingDown
            | ExecError::Draining { .. }
            | ExecError::AuditUnavailable(_) => Some(1),
            ExecError::TooManyRequests { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The request was refused before or without running (not a server fault).
    pub fn is_client_error(&self) -> bool {
        self.status() < 500
    }
}

/// The executor could not start.
// Each variant's `#[error]` message says what it is.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    #[error("the sandbox probe failed")]
    Probe(#[source] tokio::task::JoinError),
    #[error("environment {env:?} has allowed_hosts, which cannot be enforced: {why}")]
    Egress { env: String, why: String },
    #[error("error preparing the server's temporary directory")]
    TempDir(#[source] io::Error),
    #[error("error writing the worker bootstrap to {path}")]
    Bootstrap {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("environment {env:?} cannot start workers")]
    DefaultEnv {
        env: String,
        #[source]
        source: WorkerError,
    },
    #[error("error opening the audit log")]
    Audit(#[source] io::Error),
    #[error(transparent)]
    Clients(#[from] ClientsError),
}

/// The clients file cannot be used (at start: the server does not start;
/// on reload: the clients in force stay).
// Each variant's `#[error]` message says what it is.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
pub enum ClientsError {
    #[error("error reading clients file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid clients file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid clients file: {0}")]
    Invalid(String),
}

/// A configuration that cannot be used.
// Each variant's `#[error]` message says what it is.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("error reading config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting: {0}")]
    Invalid(String),
    #[error("no Python interpreter found: {0}")]
    NoInterpreter(String),
    #[error("no Conda environment named {name:?}; found: {found}")]
    UnknownCondaEnv { name: String, found: String },
    #[error("error generating a token from /dev/urandom")]
    Token(#[source] io::Error),
}

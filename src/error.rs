//! Typed errors, one enum per layer.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::protocol::FrameError;

/// A worker process failed to start, broke the protocol or died.
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
    #[error("worker crashed{0}")]
    Crashed(String),
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
    #[error("all {0} workers the server may run are busy and none is idle to retire")]
    AtCapacity(usize),
}

/// Getting a worker from an environment's pool failed.
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
/// their own error shape (HTTP status and code, MCP tool error).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("{0}")]
    BadRequest(String),
    /// A part of the request is over its configured limit (named in the message).
    #[error("{0}")]
    TooLarge(String),
    #[error("unknown environment {name:?}; known environments: {known}")]
    UnknownEnv { name: String, known: String },
    #[error(transparent)]
    Busy(PoolError),
    #[error("environment {env:?} is unavailable: {reason}")]
    EnvUnavailable { env: String, reason: String },
    #[error(transparent)]
    Worker(WorkerError),
    #[error("server is shutting down")]
    ShuttingDown,
    /// The replica is draining: it refuses what would outlive it.
    #[error("{0}")]
    Draining(String),
    #[error("{0}")]
    UnknownSession(String),
    #[error("{0}")]
    TooManySessions(String),
    #[error("{0}")]
    Internal(String),
}

/// A configuration that cannot be used.
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

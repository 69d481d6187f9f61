//! Stateful sessions: a persistent Python namespace per session, kept by a
//! dedicated process, with an idle TTL, caps, interrupts and limits.
//!
//! A session is started by taking a warm worker out of its environment's
//! pool (the pool refills itself) and switching it into session mode with a
//! `session` frame: the worker forks one long-lived session child, with the
//! same limits and setup as a clean run's child, that keeps one `__main__`
//! and one working directory for every call (see `python/worker.py`,
//! "Sessions"). Calls to a session are ordinary `exec` frames on that
//! worker, serialized in arrival order.
//!
//! * [`registry`]: the live sessions, their caps, the TTL reaper, closing
//!   and shutdown, and the record of sessions that ended (for clear 404s).
//! * [`live`]: one live session: its worker, serialized calls, expiry.
//! * [`clock`]: RFC 3339 timestamps for the API.

mod clock;
mod live;
mod registry;

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::RunLimits;

pub use live::{ActiveCall, Session};
pub use registry::{Reservation, Sessions};

/// Lifetimes and caps of sessions.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Idle time after which a session ends, when its creator names none.
    pub ttl: Duration,
    /// Longest idle TTL a session may ask for.
    pub max_ttl: Duration,
    /// Live sessions across all environments.
    pub max_sessions: usize,
    /// Live sessions in one environment.
    pub max_sessions_per_env: usize,
    /// How long a timed-out call may take to stop after its interrupt
    /// before the session process is killed (and the session lost).
    pub interrupt_grace: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            ttl: Duration::from_secs(600),
            max_ttl: Duration::from_secs(24 * 3600),
            max_sessions: 16,
            max_sessions_per_env: 8,
            interrupt_grace: Duration::from_secs(2),
        }
    }
}

/// `POST /sessions`, MCP `create_session`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    /// Environment name or prefix path; the default environment if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// Idle time to live in seconds, renewed by every call; the server's
    /// default if absent, capped by its maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<f64>,
    /// Default wall-clock limit of each call in seconds (a call may still
    /// name its own); the environment's default if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// Resource limits of the session process, fixed for its life; each
    /// may only lower the server's configured limit. `cpu_seconds` is a
    /// budget per call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RunLimits>,
}

/// A live session as the API shows it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct SessionInfo {
    /// Pass as `session` to `/execute` (MCP: `execute_code`).
    pub id: String,
    /// The environment the session runs in.
    pub env: String,
    /// When the session was created (RFC 3339, UTC).
    pub created_at: String,
    /// When the session ends unless a call renews it (RFC 3339, UTC).
    pub expires_at: String,
    /// Idle time to live in seconds, renewed by every call.
    pub ttl: f64,
    /// Default wall-clock limit of a call in seconds.
    pub timeout: f64,
    /// Calls completed so far.
    pub calls: u64,
    /// Whether a call is running or waiting now.
    pub busy: bool,
}

//! `/sessions` (MCP `create_session`, `list_sessions`, `close_session`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::RunLimits;
use super::object;

/// `POST /sessions`, MCP `create_session`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    /// Environment name or prefix path; the default environment if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// Idle time to live in seconds, renewed as each call that runs ends; the server's
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
    #[serde(
        default,
        deserialize_with = "object::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub limits: Option<RunLimits>,
    /// The session's network, fixed for its life: narrows the
    /// environment's allow-list.
    #[serde(
        default,
        deserialize_with = "object::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub network: Option<super::NetworkRequest>,
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
    /// Idle time to live in seconds, renewed as each call that runs ends.
    pub ttl: f64,
    /// Default wall-clock limit of a call in seconds.
    pub timeout: f64,
    /// Calls completed so far.
    pub calls: u64,
    /// Whether a call is running or waiting now.
    pub busy: bool,
}

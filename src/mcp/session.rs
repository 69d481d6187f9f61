//! Sessions over MCP: the arguments of `create_session` / `close_session`,
//! and the optional implicit session of one MCP connection.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::CreateSessionRequest;
use crate::error::ExecError;
use crate::executor::Executor;

/// Arguments of `create_session`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionArgs {
    /// Environment to run in: a name from `list_environments`. The default
    /// environment if omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// Seconds the session lives without a call (each call renews it). The
    /// server's default if omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<f64>,
    /// Default wall-clock limit of each call in the session, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// The session's network: `allowed_hosts` narrows the environment's
    /// allow-list (environments with one only).
    #[serde(
        default,
        deserialize_with = "crate::api::object::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub network: Option<crate::api::NetworkRequest>,
}

impl CreateSessionArgs {
    /// The request the tool's arguments stand for.
    pub fn into_request(self) -> CreateSessionRequest {
        CreateSessionRequest {
            env: self.env,
            ttl: self.ttl,
            timeout: self.timeout,
            limits: None,
            network: self.network,
        }
    }
}

/// Arguments of `close_session`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloseSessionArgs {
    /// The id `create_session` returned.
    pub session: String,
}

/// One MCP connection's implicit session: created on the first
/// `execute_code` that names no session, recreated if it was lost, and
/// closed when the connection ends (when the last handler clone drops).
pub struct ImplicitSession {
    executor: Arc<Executor>,
    /// The session's id once it exists; the lock also makes two first
    /// calls create one session, not two.
    id: tokio::sync::Mutex<Option<String>>,
}

impl ImplicitSession {
    /// No session yet: the first call without `session` starts one.
    pub fn new(executor: Arc<Executor>) -> ImplicitSession {
        ImplicitSession {
            executor,
            id: tokio::sync::Mutex::new(None),
        }
    }

    /// The id of the connection's session, created if there is none (or
    /// the last one is gone). The flag says a lost session was replaced.
    pub async fn id(&self) -> Result<(String, bool), ExecError> {
        let mut slot = self.id.lock().await;
        let mut replaced = false;
        if let Some(id) = slot.as_ref() {
            if self.executor.has_session(id) {
                return Ok((id.clone(), false));
            }
            replaced = true;
        }
        let info = self
            .executor
            .create_session(CreateSessionRequest::default())
            .await?;
        *slot = Some(info.id.clone());
        Ok((info.id, replaced))
    }
}

impl Drop for ImplicitSession {
    fn drop(&mut self) {
        if let Some(id) = self.id.get_mut().take()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            let _ = self.executor.close_session(&id);
        }
    }
}

//! Sessions over MCP: the arguments of `create_session` / `close_session`,
//! and the optional implicit session of one MCP connection.

use std::collections::HashMap;
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
    /// Seconds the session lives without a call (each call that runs renews it). The
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

/// One MCP connection's implicit sessions: one per environment its calls
/// name, created on the first `execute_code` in that environment that names
/// no session, recreated if it was lost, and closed when the connection
/// ends (when the last handler clone drops).
pub struct ImplicitSession {
    executor: Arc<Executor>,
    /// The sessions' ids by the id of their environment (a call naming it
    /// by name or by prefix finds the same one); the lock also makes two
    /// first calls create one session, not two.
    ids: tokio::sync::Mutex<HashMap<usize, String>>,
}

impl ImplicitSession {
    /// No session yet: the first call without `session` starts one.
    pub fn new(executor: Arc<Executor>) -> ImplicitSession {
        ImplicitSession {
            executor,
            ids: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The id of the connection's session in `env` (the default
    /// environment if `None`), created if there is none (or the last one
    /// is gone). The flag says a lost session was replaced.
    pub async fn id(&self, env: Option<&str>) -> Result<(String, bool), ExecError> {
        self.executor.find_env(env).await;
        let env_id = self.executor.env_id(env)?;
        let mut ids = self.ids.lock().await;
        let mut replaced = false;
        if let Some(id) = ids.get(&env_id) {
            if self.executor.has_session(id) {
                return Ok((id.clone(), false));
            }
            replaced = true;
        }
        let info = self
            .executor
            .create_session(CreateSessionRequest {
                env: env.map(str::to_string),
                ..CreateSessionRequest::default()
            })
            .await?;
        ids.insert(env_id, info.id.clone());
        Ok((info.id, replaced))
    }
}

impl Drop for ImplicitSession {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            for (_, id) in self.ids.get_mut().drain() {
                let _ = self.executor.close_session(&id);
            }
        }
    }
}

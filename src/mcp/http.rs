//! MCP over streamable HTTP: the `rmcp` tower service the axum server nests
//! at `/mcp` (behind the same bearer token as `/execute`).

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::executor::Executor;
use crate::mcp::McpHandler;

/// The streamable HTTP MCP service: stateful sessions (`Mcp-Session-Id`), so
/// a client's `notifications/cancelled` reaches the run it names. `stop`
/// ends every session (and cancels its in-flight runs) when the server shuts
/// down; without it open event streams would hold the shutdown up.
///
/// Host-header checking (DNS-rebinding protection) stays on, loopback names
/// only, while the server listens on a loopback address. Bound to any other
/// address the operator exposed it deliberately: any Host is accepted and the
/// bearer token is the guard.
pub fn http_service(
    executor: Arc<Executor>,
    config: &Config,
    stop: CancellationToken,
) -> StreamableHttpService<McpHandler, LocalSessionManager> {
    let mut http_config = StreamableHttpServerConfig::default()
        .with_cancellation_token(stop)
        .with_max_request_body_bytes(config.max_body_bytes);
    if !config.host.is_loopback() {
        http_config = http_config.disable_allowed_hosts();
    }
    // Built once; each session gets a copy (cheap: `Arc`s and the router)
    // with its own implicit session, if those are on.
    let handler = McpHandler::new(executor, config);
    StreamableHttpService::new(
        move || Ok(handler.for_connection()),
        Arc::new(LocalSessionManager::default()),
        http_config,
    )
}

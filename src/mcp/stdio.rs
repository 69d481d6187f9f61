//! MCP over standard input/output (`code-executor mcp`): one client, the
//! process's lifetime. stdout is the protocol channel; logs go to stderr.

use std::future::Future;
use std::sync::Arc;

use rmcp::ServiceExt;
use rmcp::service::ServerInitializeError;
use rmcp::transport::stdio_pipes;

use crate::config::Config;
use crate::executor::Executor;
use crate::mcp::McpHandler;

/// Why serving over stdio failed.
#[derive(Debug, thiserror::Error)]
pub enum StdioError {
    #[error("MCP handshake over stdio failed")]
    Handshake(#[source] ServerInitializeError),
    #[error("MCP service task failed")]
    Service(#[source] tokio::task::JoinError),
}

/// Serve MCP on stdin/stdout until the client closes stdin or `shutdown`
/// resolves, then shut the executor down: in-flight runs are cancelled (their
/// process trees killed) and every worker is terminated, so no process is
/// left behind.
pub async fn serve_stdio(
    executor: Arc<Executor>,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), StdioError> {
    let handler = McpHandler::new(executor.clone(), config);
    let served = async {
        // Non-blocking pipe I/O when the client gave us pipes (the usual
        // case), so a pending read never holds up the runtime's shutdown.
        let running = handler
            .serve(stdio_pipes())
            .await
            .map_err(StdioError::Handshake)?;
        tracing::info!(env = executor.default_env(), "MCP client connected over stdio");
        let stop = running.cancellation_token();
        tokio::pin!(shutdown);
        let waiting = running.waiting();
        tokio::pin!(waiting);
        let reason = tokio::select! {
            reason = &mut waiting => reason,
            _ = &mut shutdown => {
                tracing::info!("shutting down: cancelling MCP requests");
                stop.cancel();
                waiting.await
            }
        }
        .map_err(StdioError::Service)?;
        tracing::info!(?reason, "MCP stdio session ended");
        Ok(())
    };
    let result = served.await;
    executor.shutdown().await;
    result
}

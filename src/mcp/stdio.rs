//! MCP over standard input/output (`code-executor mcp`): one client, the
//! process's lifetime. stdout is the protocol channel; logs go to stderr.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rmcp::ServiceExt;
use rmcp::service::ServerInitializeError;
use rmcp::transport::stdio_pipes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::executor::Executor;
use crate::mcp::McpHandler;

/// Why serving over stdio failed.
#[derive(Debug, thiserror::Error)]
pub enum StdioError {
    #[error("MCP handshake over stdio failed")]
    /// The client's `initialize` handshake failed.
    Handshake(#[source] Box<ServerInitializeError>),
    #[error("MCP service task failed")]
    /// The MCP service task failed.
    Service(#[source] tokio::task::JoinError),
}

/// Serve MCP on stdin/stdout until the client closes stdin or `shutdown`
/// resolves, then shut the executor down: in-flight runs are cancelled (their
/// process trees killed) and every worker is terminated, so no process is
/// left behind.
///
/// Closing stdin is how an MCP client stops a stdio server, so end of input
/// cancels in-flight runs at once (rmcp alone would wait up to 5 s for them,
/// longer than clients wait before they kill the server).
pub async fn serve_stdio(
    executor: Arc<Executor>,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), StdioError> {
    let handler = McpHandler::new(executor.clone(), config);
    // Non-blocking pipe I/O when the client gave us pipes (the usual case),
    // so a pending read never holds up the runtime's shutdown.
    let (stdin, stdout) = stdio_pipes();
    let result = serve_until_closed(handler, stdin, stdout, "stdio", shutdown).await;
    executor.shutdown().await;
    result
}

/// Serve one client on `input`/`output` until its service ends, it closes
/// its input (which cancels its in-flight runs at once) or `shutdown`
/// resolves (which cancels them too).
pub(crate) async fn serve_until_closed<R, W>(
    handler: McpHandler,
    input: R,
    output: W,
    over: &'static str,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), StdioError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let input_closed = CancellationToken::new();
    let input = EofSignal {
        inner: input,
        eof: input_closed.clone(),
    };
    let env = handler.default_env();
    tokio::pin!(shutdown);
    let running = tokio::select! {
        served = handler.serve((input, output)) => {
            served.map_err(|e| StdioError::Handshake(Box::new(e)))?
        }
        _ = &mut shutdown => return Ok(()),
    };
    tracing::info!(env, over, "MCP client connected");
    let stop = running.cancellation_token();
    let waiting = running.waiting();
    tokio::pin!(waiting);
    let reason = tokio::select! {
        reason = &mut waiting => reason,
        _ = &mut shutdown => {
            tracing::info!(over, "shutting down: cancelling MCP requests");
            stop.cancel();
            waiting.await
        }
        _ = input_closed.cancelled() => {
            tracing::debug!(over, "input closed: cancelling in-flight MCP requests");
            stop.cancel();
            waiting.await
        }
    }
    .map_err(StdioError::Service)?;
    tracing::info!(?reason, over, "MCP session ended");
    Ok(())
}

/// Reads from `inner` and cancels `eof` when it reports end of input.
struct EofSignal<R> {
    inner: R,
    /// Cancelled at end of input: the client is gone.
    eof: CancellationToken,
}

impl<R: AsyncRead + Unpin> AsyncRead for EofSignal<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let wanted = buf.remaining() > 0;
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && wanted && buf.filled().len() == before {
            self.eof.cancel();
        }
        polled
    }
}

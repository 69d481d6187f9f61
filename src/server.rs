//! Serving: bind the HTTP front end to a listener and run until shutdown.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::middleware;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::executor::Executor;
use crate::http::observe::observe;
use crate::http::{AppState, require_token, router};
use crate::mcp;

/// Serve `executor` on `listener` until `shutdown` resolves; then stop
/// accepting, let in-flight requests finish (at most `shutdown_timeout`) and
/// terminate every worker.
pub async fn run(
    listener: TcpListener,
    executor: Arc<Executor>,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = AppState {
        executor: executor.clone(),
        token: config.token.as_deref().map(Arc::from),
        admin_token: config.admin_token.as_deref().map(Arc::from),
        metrics_token: config.metrics_token.as_deref().map(Arc::from),
    };
    // MCP sessions are long-lived event streams: they end (and cancel their
    // in-flight runs) when shutdown starts, or they would hold it up.
    let mcp_stop = CancellationToken::new();
    let mcp = Router::new()
        .nest_service(
            "/mcp",
            mcp::http_service(executor.clone(), config, mcp_stop.child_token()),
        )
        .layer(middleware::from_fn_with_state(state.clone(), require_token));
    // Request ids, request spans and HTTP metrics cover every route, MCP too.
    let app = router(state.clone(), config.max_body_bytes)
        .merge(mcp)
        .layer(middleware::from_fn_with_state(state, observe));
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    // Responses go out as soon as they are written. Without TCP_NODELAY an
    // MCP result (an SSE event written after the response head and priming
    // event) waits in Nagle's buffer for the client's delayed ACK: ~40 ms.
    let listener = listener.tap_io(|tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::warn!("cannot set TCP_NODELAY on a connection: {err}");
        }
    });
    let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight requests");
        mcp_stop.cancel();
        stopped.notify_one();
    });
    let drain_limit = config.shutdown_timeout;
    let result = tokio::select! {
        r = serve => r,
        _ = async { stop.notified().await; tokio::time::sleep(drain_limit).await } => {
            tracing::warn!("in-flight requests did not finish within {drain_limit:?}");
            Ok(())
        }
    };
    executor.shutdown().await;
    result
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

//! Serving: bind the HTTP front end to a listener and run until shutdown.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::executor::Executor;
use crate::http::{AppState, router};

/// Serve `executor` on `listener` until `shutdown` resolves; then stop
/// accepting, let in-flight requests finish (at most `shutdown_timeout`) and
/// terminate every worker.
pub async fn run(
    listener: TcpListener,
    executor: Arc<Executor>,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(
        AppState {
            executor: executor.clone(),
            token: config.token.as_deref().map(Arc::from),
            admin_token: config.admin_token.as_deref().map(Arc::from),
        },
        config.max_body_bytes,
    );
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight requests");
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

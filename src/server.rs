//! Serving: bind the HTTP front end to a listener and run until shutdown.
//!
//! Stopping behind a load balancer (SIGTERM, [`Stop::Drain`]) goes in three
//! steps, so that no request the balancer sends is lost:
//! 1. **drain** for `drain_delay`: `/health` (readiness) answers 503
//!    `draining`, responses carry `connection: close` (no kept-alive
//!    connection is left for the balancer to reuse later), new sessions are
//!    refused with a retryable 503; everything else is served as before
//!    (`/livez` stays 200 until exit);
//! 2. **stop accepting**, and let in-flight requests finish (at most
//!    `shutdown_timeout`); MCP event streams end;
//! 3. **end** every session and terminate every worker. A later call to one
//!    of its sessions reaches another replica, which answers `404
//!    unknown_session` naming the replica that held it.
//!
//! SIGINT ([`Stop::Now`], a terminal's Ctrl-C) skips the drain delay.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::middleware;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConnectionLimits};
use crate::executor::Executor;
use crate::http::guard::{self, BodyLimits};
use crate::http::observe::observe;
use crate::http::own_wakes::OwnWakes;
use crate::http::{AppState, mcp_gate, router};
use crate::mcp;

/// How a stop was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Drain first: readiness off for `drain_delay` while serving (SIGTERM,
    /// what orchestrators send).
    Drain,
    /// Stop accepting at once (SIGINT).
    Now,
}

/// A plain shutdown future asks for a drain.
impl From<()> for Stop {
    fn from((): ()) -> Stop {
        Stop::Drain
    }
}

/// Serve `executor` on `listener` until `shutdown` resolves; then drain for
/// `drain_delay` (unless it asks for [`Stop::Now`]), stop accepting, let
/// in-flight requests finish (at most `shutdown_timeout`) and terminate
/// every worker.
pub async fn run<S: Into<Stop>>(
    listener: TcpListener,
    executor: Arc<Executor>,
    config: &Config,
    shutdown: impl Future<Output = S> + Send + 'static,
) -> std::io::Result<()> {
    // The egress proxies refuse this server's own addresses unless listed.
    executor.set_listen_addresses(listener.local_addr().into_iter().collect());
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
        .layer(middleware::from_fn(mcp_gate(state.clone())));
    let app = router(state.clone(), config.max_body_bytes).merge(mcp);
    let mut limits = config.connections;
    limits.max_connections = connection_budget(limits.max_connections);
    let body = BodyLimits {
        read_timeout: limits.body_read_timeout,
        max_bytes: config.max_body_bytes,
    };
    let replica = executor.replica().clone();
    // Request ids, request spans and HTTP metrics cover every route, MCP
    // too, and the body guard's own answers (408, 413).
    let app = app
        .layer(middleware::from_fn(move |req, next| {
            guard::read_body_within(body, req, next)
        }))
        .layer(middleware::from_fn_with_state(state, observe))
        .layer(middleware::from_fn(move |req, next| {
            replica_headers(replica.clone(), req, next)
        }))
        .layer(guard::catch_panics());
    let drain_limit = config.shutdown_timeout;
    let graceful = GracefulShutdown::new();
    let drain_delay = config.drain_delay;
    let draining = executor.clone();
    let stop_accepting = async move {
        let stop: Stop = shutdown.await.into();
        draining.drain();
        if stop == Stop::Drain && !drain_delay.is_zero() {
            tracing::info!(
                replica = draining.replica().id(),
                "draining: /health answers 503 for {drain_delay:?} while requests are still served"
            );
            tokio::time::sleep(drain_delay).await;
        }
    };
    let reload = tokio::spawn(reload_on_sighup(executor.clone()));
    serve_connections(listener, app, limits, &graceful, stop_accepting).await;
    reload.abort();
    tracing::info!("shutting down: finishing in-flight requests");
    mcp_stop.cancel();
    if tokio::time::timeout(drain_limit, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish within {drain_limit:?}");
    }
    executor.shutdown().await;
    Ok(())
}

/// Accept connections until `shutdown` resolves, each served with the
/// header timeout of `limits` and counted against its cap.
async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    graceful: &GracefulShutdown,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    // One permit per connection being served.
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let (tcp, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(err) => {
                    // Out of descriptors (or a connection reset before it
                    // was accepted): wait a little rather than spin.
                    tracing::warn!("cannot accept a connection: {err}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        // Responses go out as soon as they are written. Without TCP_NODELAY
        // an MCP result (an SSE event written after the response head and
        // priming event) waits in Nagle's buffer for the client's delayed
        // ACK: ~40 ms.
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::warn!("cannot set TCP_NODELAY on a connection: {err}");
        }
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tokio::spawn(refuse(tcp, limits.max_connections));
            continue;
        };
        // The peer's address, for the audit log (`ConnectInfo`, as axum's
        // own server would give it).
        let service = TowerToHyperService::new(tower::ServiceExt::map_request(
            app.clone(),
            move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(remote));
                req
            },
        ));
        let conn = graceful.watch(http.serve_connection(TokioIo::new(tcp), service));
        // A request body wakes the connection's own task twice (see
        // `OwnWakes`): polled again at once, no other thread is woken.
        let conn = OwnWakes::new(conn);
        tokio::spawn(async move {
            // Errors here are the client's (reset, timed out): not ours to log.
            let _ = conn.await;
            drop(permit);
        });
    }
}

/// Every response names the replica that answered (`x-replica`), so that
/// affinity can be checked from a client; while draining it also asks the
/// client (a balancer) to close the connection, so that none is left
/// kept alive for a request to race the replica's stop.
async fn replica_headers(
    replica: Arc<crate::replica::Replica>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    let mut response = next.run(req).await;
    let headers = response.headers_mut();
    if let Ok(id) = axum::http::HeaderValue::from_str(replica.id()) {
        headers.insert(REPLICA_HEADER, id);
    }
    if replica.is_draining() {
        headers.insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// The response header naming the replica that answered.
pub const REPLICA_HEADER: &str = "x-replica";

/// Answer a connection past the cap with a plain `503` and close it.
async fn refuse(mut tcp: tokio::net::TcpStream, cap: usize) {
    use tokio::io::AsyncWriteExt;
    let body = format!(
        "{{\"error\":{{\"code\":\"busy\",\"message\":\"the server is at its cap of {cap} connections (max_connections)\"}}}}"
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, tcp.write_all(answer.as_bytes())).await;
}

/// Pause after a failed `accept` (descriptors exhausted).
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(20);
/// Bound on writing the refusal to a connection past the cap.
const REFUSAL_WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Process-wide hardening, called first by every command that serves:
/// * every descriptor the server inherited (3 and up) becomes close-on-exec,
///   so no worker, install or activation script it starts sees one;
/// * the process is not dumpable, so no process of the same user (a run in
///   the container tier) can read its `/proc/<pid>/environ`, `cmdline` or
///   memory, where its tokens are;
/// * its soft descriptor limit is raised to the hard one, so that many
///   connections cannot starve the workers' pipes.
pub fn harden_process() -> std::io::Result<()> {
    crate::sys::cloexec_from_3()?;
    nix::sys::prctl::set_dumpable(false)?;
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(())
}

/// Connections the process can serve besides what its workers and their
/// pipes need: the descriptor limit less a reserve.
fn connection_budget(configured: usize) -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024);
    let budget = usize::try_from(soft.saturating_sub(DESCRIPTOR_RESERVE)).unwrap_or(usize::MAX);
    configured.min(budget.max(1))
}

/// Descriptors kept back from connections: workers' pipes, cgroup files,
/// installs, logs.
const DESCRIPTOR_RESERVE: u64 = 512;

/// On every SIGHUP: reopen the audit log (logrotate moved it) and re-read
/// the clients file. Runs until aborted; requests in flight keep the
/// client they authenticated as, new ones get the new rights.
pub async fn reload_on_sighup(executor: Arc<Executor>) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(hup) => hup,
        Err(err) => {
            tracing::error!("cannot listen for SIGHUP (no reloads): {err}");
            return;
        }
    };
    while hup.recv().await.is_some() {
        let _ = executor.reload();
    }
}

/// Resolves on SIGTERM ([`Stop::Drain`]) or SIGINT ([`Stop::Now`]).
pub async fn drain_signal() -> Stop {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Stop::Now,
        _ = term.recv() => Stop::Drain,
    }
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

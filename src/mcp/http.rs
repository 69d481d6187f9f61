//! MCP over streamable HTTP: the `rmcp` tower service the axum server nests
//! at `/mcp` (behind the same bearer token as `/execute`), with a thin layer
//! where rmcp's answers differ from the specification's.

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::SessionManager;
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
pub fn http_service(executor: Arc<Executor>, config: &Config, stop: CancellationToken) -> Router {
    let mut http_config = StreamableHttpServerConfig::default()
        .with_cancellation_token(stop)
        .with_max_request_body_bytes(config.max_body_bytes);
    if !config.host.is_loopback() {
        http_config = http_config.disable_allowed_hosts();
    }
    // Built once; each session gets a copy (cheap: `Arc`s and the router)
    // with its own implicit session, if those are on.
    let handler = McpHandler::new(executor, config);
    let sessions = Arc::new(LocalSessionManager::default());
    let service = StreamableHttpService::new(
        move || Ok(handler.for_connection()),
        sessions.clone(),
        http_config,
    );
    Router::new()
        .fallback_service(service)
        .layer(middleware::from_fn(move |req, next| {
            as_specified(sessions.clone(), req, next)
        }))
}

/// What `/mcp` answers as the specification (streamable HTTP, 2025-11-25)
/// asks, where rmcp 3.11 answers otherwise:
/// * `DELETE` naming an MCP session that does not exist (never did, or has
///   ended) is `404 Not Found`, as every other request naming one is; rmcp
///   answers it `202 Accepted`.
/// * A call's event stream taken up again with `Last-Event-ID` goes on after
///   that event; rmcp sends that event again first (see
///   [`event_after`]).
async fn as_specified(
    sessions: Arc<LocalSessionManager>,
    mut req: Request,
    next: Next,
) -> Response {
    if req.method() == Method::GET
        && let Some(after) = req
            .headers()
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .and_then(event_after)
            .and_then(|id| id.parse().ok())
    {
        req.headers_mut().insert("last-event-id", after);
    }
    let mut unknown = false;
    if req.method() == Method::DELETE
        && let Some(id) = req
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
    {
        // A lookup that fails leaves rmcp's answer as it is.
        unknown = !sessions.has_session(&id.into()).await.unwrap_or(true);
    }
    let response = next.run(req).await;
    // rmcp checks the request first (host, protocol version); only its
    // answer that it ended the session becomes the 404.
    if unknown && response.status() == StatusCode::ACCEPTED {
        return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    }
    response
}

/// The `Last-Event-ID` that makes rmcp's session cache resume after event
/// `last` of a call's stream, not at it. Those events' ids are
/// `<index>/<stream>`; rmcp replays the cached events from `<index>` on,
/// the event the client already has among them. The ids of the stream a
/// `GET` opens are bare indices, and its first (priming) event shares index
/// 0 with the first cached one, so a bare index cannot say which the client
/// has: those are left alone.
fn event_after(last: &str) -> Option<String> {
    let (index, stream) = last.split_once('/')?;
    let index: usize = index.parse().ok()?;
    let stream: u64 = stream.parse().ok()?;
    Some(format!("{}/{stream}", index.checked_add(1)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_streams_event_id_moves_one_on_and_others_stay() {
        assert_eq!(event_after("1/0").as_deref(), Some("2/0"));
        assert_eq!(event_after("0/17").as_deref(), Some("1/17"));
        assert_eq!(event_after("3"), None);
        assert_eq!(event_after("a/0"), None);
        assert_eq!(event_after("1/x"), None);
    }
}

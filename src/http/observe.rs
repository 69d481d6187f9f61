//! The outermost middleware: a request id for every request (the client's
//! `x-request-id` when it is sane, else a new one), echoed in the response
//! and attached to every log line of the request through a span, and the
//! HTTP metrics (requests by route and status, requests in flight).

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use super::AppState;

/// The header carrying the request id, both ways.
pub const REQUEST_ID: &str = "x-request-id";

/// Longest client-supplied request id kept.
const MAX_REQUEST_ID: usize = 128;

/// Label of requests that matched no route (404s): one series, however many
/// paths are probed.
const UNMATCHED: &str = "unmatched";

/// Decrements the in-flight gauge when the request ends, however it ends.
struct InFlight<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Count every request in the metrics and log it (method, route, status, duration).
pub async fn observe(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let metrics = state.executor.metrics().clone();
    metrics.http_in_flight().inc();
    let _in_flight = InFlight(metrics.http_in_flight());
    let id = req
        .headers()
        .get(REQUEST_ID)
        .filter(|v| is_sane(v.as_bytes()))
        .cloned()
        .unwrap_or_else(new_request_id);
    req.headers_mut().insert(REQUEST_ID, id.clone());
    let method = req.method().clone();
    let route = req.extensions().get::<MatchedPath>().cloned();
    let span = tracing::info_span!(
        "request",
        request_id = id.to_str().unwrap_or_default(),
        method = %method,
        route = route.as_ref().map_or(UNMATCHED, MatchedPath::as_str),
    );
    let mut response = next.run(req).instrument(span).await;
    metrics.http_request(
        &method,
        route.as_ref().map_or(UNMATCHED, MatchedPath::as_str),
        response.status().as_u16(),
    );
    response.headers_mut().insert(REQUEST_ID, id);
    response
}

/// A client's id is kept when it is short printable ASCII without spaces
/// (so it cannot forge log lines or headers).
fn is_sane(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REQUEST_ID
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=@".contains(b))
}

/// A new request id as text (MCP calls get one each).
pub(crate) fn new_request_id_str() -> std::sync::Arc<str> {
    std::sync::Arc::from(new_request_id().to_str().unwrap_or("0"))
}

/// 32 hex digits: a per-process random prefix and a counter, unique within
/// the process and unlikely to repeat across replicas.
fn new_request_id() -> HeaderValue {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.finish()
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    HeaderValue::try_from(format!("{seed:016x}{n:016x}"))
        .unwrap_or_else(|_| HeaderValue::from_static("0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_kept_only_when_sane() {
        assert!(is_sane(b"req-42"));
        assert!(is_sane(b"0b6f2c1e-8d7a-4a51-9f0e-3c2b1a0d9e8f"));
        assert!(!is_sane(b""));
        assert!(!is_sane(b"two words"));
        assert!(!is_sane(b"line\nbreak"));
        assert!(!is_sane(&[b'a'; MAX_REQUEST_ID + 1]));
        let a = new_request_id();
        let b = new_request_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
    }
}

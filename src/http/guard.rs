//! Guards every route shares, MCP's included: a request body must arrive
//! whole within a deadline (a client that sends less than its
//! `Content-Length` holds nothing for long), and a handler that panics
//! answers `500` with the API's JSON error instead of dropping the
//! connection.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// How long a request body may take to arrive, and how large it may be.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// From the end of the headers to the last byte of the body.
    pub read_timeout: Duration,
    /// Largest body accepted (413 above it).
    pub max_bytes: usize,
}

/// Read the whole body within `limits.read_timeout` before the handler
/// sees the request: `408 request_timeout` past it, `413 too_large` over
/// `limits.max_bytes`. Requests without a body pass untouched.
pub async fn read_body_within(limits: BodyLimits, req: Request, next: Next) -> Response {
    let has_body = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .is_some_and(|v| v.as_bytes() != b"0")
        || req
            .headers()
            .contains_key(axum::http::header::TRANSFER_ENCODING);
    if !has_body {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let read = axum::body::to_bytes(body, limits.max_bytes);
    let bytes = match tokio::time::timeout(limits.read_timeout, read).await {
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request body did not arrive within {} s (body_read_timeout_secs)",
                    limits.read_timeout.as_secs_f64()
                ),
            )
            .into_response();
        }
        Ok(Err(e)) if is_length_limit(&e) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                "request body exceeds the size limit (max_body_bytes)",
            )
            .into_response();
        }
        Ok(Err(e)) => {
            return ApiError::bad_request(format!("unreadable request body: {e}")).into_response();
        }
        Ok(Ok(bytes)) => bytes,
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn is_length_limit(err: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// The answer to a handler that panicked: logged once here, a generic
/// `500 internal` to the client.
pub fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".into());
    tracing::error!("request handler panicked: {what}");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal server error",
    )
    .into_response()
}

/// The layer that turns panics into [`panic_response`].
pub fn catch_panics()
-> tower_http::catch_panic::CatchPanicLayer<fn(Box<dyn std::any::Any + Send>) -> Response> {
    tower_http::catch_panic::CatchPanicLayer::custom(panic_response as fn(_) -> Response)
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::routing::get;
    use tower::ServiceExt;

    #[tokio::test]
    async fn a_panicking_handler_answers_500_json() {
        async fn boom() -> &'static str {
            if std::hint::black_box(true) {
                panic!("boom");
            }
            "unreachable"
        }
        let app = Router::new()
            .route("/boom", get(boom))
            .layer(super::catch_panics());
        let answer = app
            .oneshot(
                axum::http::Request::get("/boom")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(answer.status(), 500);
        let body = axum::body::to_bytes(answer.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "internal", "{body}");
    }
}

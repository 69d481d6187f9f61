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
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

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
///
/// A body over the limit is still read to its end and thrown away, up to
/// [`drain_allowance`] bytes and within the same deadline, before the 413
/// goes out. A client that writes its whole body before it reads (most do)
/// then gets the 413 and keeps its connection; had the server closed the
/// connection with the body unread, the client would see a write error or
/// a reset instead of the answer. A body longer than the allowance, by its
/// `Content-Length` or as it arrives, is answered at once and its
/// connection closed.
pub async fn read_body_within(limits: BodyLimits, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let has_body = declared.is_some_and(|n| n > 0)
        || req
            .headers()
            .contains_key(axum::http::header::TRANSFER_ENCODING);
    if !has_body {
        return next.run(req).await;
    }
    let deadline = tokio::time::Instant::now() + limits.read_timeout;
    let (parts, body) = req.into_parts();
    let read = match tokio::time::timeout_at(
        deadline,
        read_capped(body, declared, limits.max_bytes),
    )
    .await
    {
        Ok(read) => read,
        Err(_) => return timed_out(limits.read_timeout),
    };
    let rest = match read {
        Ok(Capped::Whole(bytes)) => {
            return next
                .run(Request::from_parts(parts, Body::from(bytes)))
                .await;
        }
        Ok(Capped::Over(rest)) => rest,
        Err(e) => {
            return ApiError::bad_request(format!("unreadable request body: {e}")).into_response();
        }
    };
    let allowance = drain_allowance(limits.max_bytes);
    if declared.is_none_or(|n| n <= allowance as u64) {
        // Whatever stops the drain (the deadline, a broken body, the
        // allowance) the answer is the same 413; hyper closes a connection
        // whose body was left unread.
        let _ = tokio::time::timeout_at(deadline, discard(rest, allowance)).await;
    }
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        "request body exceeds the size limit (max_body_bytes)",
    )
    .into_response()
}

/// How much of a body over `max_bytes` is read and discarded so its
/// client sees the 413: as much again as the limit, and at least 64 MiB.
fn drain_allowance(max_bytes: usize) -> usize {
    max_bytes.max(64 << 20)
}

/// A body read up to a limit.
enum Capped {
    /// All of it, within the limit.
    Whole(Bytes),
    /// Over the limit: the body, with what was read so far dropped.
    Over(Body),
}

/// Read `body` whole if it fits in `max_bytes`. A `Content-Length` over
/// the limit is [`Capped::Over`] before a byte is read.
async fn read_capped(
    mut body: Body,
    declared: Option<u64>,
    max_bytes: usize,
) -> Result<Capped, axum::Error> {
    if declared.is_some_and(|n| n > max_bytes as u64) {
        return Ok(Capped::Over(body));
    }
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        total += data.len();
        if total > max_bytes {
            return Ok(Capped::Over(body));
        }
        chunks.push(data);
    }
    Ok(Capped::Whole(match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().unwrap_or_default(),
        _ => {
            let mut whole = BytesMut::with_capacity(total);
            for chunk in chunks {
                whole.extend_from_slice(&chunk);
            }
            whole.freeze()
        }
    }))
}

/// Read and drop up to `allowance` bytes of `body`, stopping early at
/// the first error.
async fn discard(mut body: Body, allowance: usize) {
    let mut left = allowance;
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            match left.checked_sub(data.len()) {
                Some(rest) => left = rest,
                None => return,
            }
        }
    }
}

fn timed_out(read_timeout: Duration) -> Response {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "request_timeout",
        format!(
            "the request body did not arrive within {} s (body_read_timeout_secs)",
            crate::limits::readable(read_timeout.as_secs_f64())
        ),
    )
    .into_response()
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

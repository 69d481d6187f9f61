//! The one HTTP error type: `{"error": {"code": "...", "message": "..."}}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::ExecError;
use crate::error::error_chain;

/// An error answered to an HTTP client.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The error code in the body (`bad_request`, `busy`, ...).
    pub code: &'static str,
    /// What the client reads.
    pub message: String,
    /// Seconds after which a retry may succeed (`503 busy`).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with its status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// A `400 bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
}

impl ApiError {
    /// The JSON body: `{"error": {"code": "...", "message": "..."}}`.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"code": self.code, "message": self.message}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, "{}", self.message);
        }
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl From<ExecError> for ApiError {
    fn from(err: ExecError) -> Self {
        ApiError {
            status: StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code: err.code(),
            message: error_chain(&err),
            retry_after: err.retry_after(),
        }
    }
}

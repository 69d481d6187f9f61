//! The one HTTP error type: `{"error": {"code": "...", "message": "..."}}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::{ExecError, PoolError};
use crate::pool::error_chain;

/// An error answered to an HTTP client.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds after which a retry may succeed (`503 busy`).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

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
        let message = error_chain(&err);
        match err {
            ExecError::BadRequest(_) => ApiError::bad_request(message),
            ExecError::TooLarge(_) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
            }
            ExecError::UnknownEnv { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_env", message)
            }
            ExecError::Busy(PoolError::Busy(wait)) => ApiError {
                retry_after: Some(wait.as_secs().clamp(1, 60)),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message)
            },
            ExecError::Busy(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message),
            ExecError::EnvUnavailable { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "env_unavailable", message)
            }
            ExecError::ShuttingDown => ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
            },
            ExecError::Draining(_) => ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "draining", message)
            },
            ExecError::UnknownSession(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_session", message)
            }
            ExecError::TooManySessions(_) => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_sessions", message)
            }
            ExecError::Worker(_) | ExecError::Internal(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

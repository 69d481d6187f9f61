//! The HTTP router alone, called with `oneshot` (no listener, no client):
//! authentication, refusals of malformed requests, limits and the fallback,
//! each answered with the JSON error body.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use code_executor::Executor;
use code_executor::http::{AppState, router};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::common;

const TOKEN: &str = "s3cret";
const ADMIN: &str = "adm1n";

/// The process's one executor (the test harness runs each test in a
/// process of its own); each request gets a fresh router over it.
async fn executor() -> Arc<Executor> {
    static EXECUTOR: tokio::sync::OnceCell<Arc<Executor>> = tokio::sync::OnceCell::const_new();
    EXECUTOR
        .get_or_init(|| async {
            let config = code_executor::Config {
                pool_size: 1,
                ..common::config()
            };
            Arc::new(Executor::start(&config).await.expect("executor starts"))
        })
        .await
        .clone()
}

async fn app(max_body_bytes: usize) -> axum::Router {
    router(
        AppState {
            executor: executor().await,
            token: Some(TOKEN.into()),
            admin_token: Some(ADMIN.into()),
            metrics_token: None,
        },
        max_body_bytes,
    )
}

async fn send(app: axum::Router, req: Request<Body>) -> (StatusCode, Value) {
    let resp = app.oneshot(req).await.expect("router answers");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, body)
}

fn post(path: &str, token: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut req = Request::post(path).header(header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    req.body(body.into()).unwrap()
}

fn code_of(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn execution_needs_the_token_and_installs_the_admin_token() {
    let run = json!({"code": "print(1)"}).to_string();
    let (status, body) = send(app(1 << 20).await, post("/execute", None, run.clone())).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(code_of(&body), "unauthorized");
    let (status, body) = send(
        app(1 << 20).await,
        post("/execute", Some("wrong"), run.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, body) = send(app(1 << 20).await, post("/execute", Some(TOKEN), run)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stdout"], "1\n");
    // The API token is not the admin token.
    let install = json!({"packages": ["x"]}).to_string();
    let (status, body) = send(app(1 << 20).await, post("/install", Some(TOKEN), install)).await;
    assert!(
        status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN,
        "{status} {body}"
    );
    assert!(body["error"]["message"].is_string(), "{body}");
}

#[tokio::test]
async fn malformed_bodies_get_the_json_error_body() {
    let cases = [
        ("{not json", "bad_request"),
        (r#"{"code": 5}"#, "bad_request"),
        (r#"{"code": "1", "no_such_field": true}"#, "bad_request"),
        (r#"{"code": "1", "timeout": -1}"#, "bad_request"),
        (r#"{"code": "1", "env": "no-such-env"}"#, "unknown_env"),
    ];
    for (text, code) in cases {
        let (status, body) = send(app(1 << 20).await, post("/execute", Some(TOKEN), text)).await;
        assert!(status.is_client_error(), "{text}: {status} {body}");
        assert_eq!(code_of(&body), code, "{text}: {body}");
        assert!(
            !body["error"]["message"].as_str().unwrap().is_empty(),
            "{text}: {body}"
        );
    }
}

#[tokio::test]
async fn a_body_over_the_cap_is_413() {
    let big = json!({"code": "x".repeat(4096)}).to_string();
    let (status, body) = send(app(1024).await, post("/execute", Some(TOKEN), big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(body["error"]["code"].is_string(), "{body}");
}

#[tokio::test]
async fn unknown_routes_and_open_endpoints() {
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
    let (status, body) = send(app(1 << 20).await, get("/no/such/route")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(code_of(&body), "not_found");
    // Liveness, health and the API description need no token.
    let (status, _) = send(app(1 << 20).await, get("/livez")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = send(app(1 << 20).await, get("/health")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "ok");
    let (status, body) = send(app(1 << 20).await, get("/openapi.json")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["paths"]["/execute"].is_object(), "{body}");
    // A listing needs the token.
    let (status, _) = send(app(1 << 20).await, get("/list-envs")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

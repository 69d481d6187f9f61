//! Attacks made with the request itself.

use serde_json::{Value, json};

use super::Arena;
use crate::common;

async fn post_raw(arena: &Arena, body: Vec<u8>, token: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/execute", arena.server.url))
        .header("content-type", "application/json")
        .body(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("answered");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("JSON error body"))
}

fn assert_error(status: u16, body: &Value, want_status: u16, code: &str, needle: &str) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = crate::common::error_message(body);
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
}

#[tokio::test]
async fn malformed_json_is_a_400() {
    let arena = Arena::start().await;
    let (s, b) = post_raw(&arena, b"{\"code\": \"print(1)\"".to_vec(), None).await;
    assert_error(s, &b, 400, "bad_request", "invalid JSON");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn wrong_types_are_a_400() {
    let arena = Arena::start().await;
    let (s, b) = arena.server.execute(json!({"code": 5})).await;
    assert_error(s, &b, 400, "bad_request", "invalid type");
    let (s, b) = arena
        .server
        .execute(json!({"code": "1", "timeout": "soon"}))
        .await;
    assert_error(s, &b, 400, "bad_request", "expected f64");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn a_50_mb_body_is_a_413_naming_the_limit() {
    let arena = Arena::start().await;
    let mut body = b"{\"code\": \"".to_vec();
    body.extend(std::iter::repeat_n(b'x', 50 << 20));
    body.extend(b"\"}");
    let (s, b) = post_raw(&arena, body, None).await;
    assert_error(s, &b, 413, "too_large", "max_body_bytes");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn code_and_files_over_their_limits_are_413s_naming_the_limit() {
    let arena = Arena::with_config(code_executor::Config {
        request_limits: code_executor::config::RequestLimits {
            max_code_bytes: 1000,
            max_files: 3,
            max_files_bytes: 100,
        },
        ..common::config()
    })
    .await;
    let (s, b) = arena
        .server
        .execute(json!({"code": "#".repeat(1001)}))
        .await;
    assert_error(s, &b, 413, "too_large", "max_code_bytes");
    let files: serde_json::Map<String, Value> =
        (0..4).map(|i| (format!("f{i}"), json!("x"))).collect();
    let (s, b) = arena
        .server
        .execute(json!({"code": "pass", "files": files}))
        .await;
    assert_error(s, &b, 413, "too_large", "max_files limit");
    let (s, b) = arena
        .server
        .execute(json!({"code": "pass", "files": {"a": "x".repeat(101)}}))
        .await;
    assert_error(s, &b, 413, "too_large", "max_files_bytes");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn path_traversal_in_files_is_refused() {
    let arena = Arena::start().await;
    for path in ["../x", "/etc/x", "a/../../x", "a/../b", "", "a\u{0}b"] {
        let (s, b) = arena
            .server
            .execute(json!({"code": "pass", "files": {path: "x"}}))
            .await;
        assert_eq!(s, 400, "{path:?}: {b}");
        assert_eq!(b["error"]["code"], "bad_request", "{path:?}: {b}");
    }
    // A run's symlink to a file it may not read never becomes an artifact.
    let body = arena
        .attack(json!({"code": "import os\nos.symlink('/etc/hostname', 'link')\nos.symlink('/', 'root')"}))
        .await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["artifacts"], json!([]), "{body}");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn an_unknown_env_is_a_404() {
    let arena = Arena::start().await;
    let (s, b) = arena
        .server
        .execute(json!({"code": "pass", "env": "../../etc"}))
        .await;
    assert_error(s, &b, 404, "unknown_env", "unknown environment");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn a_missing_or_wrong_token_is_a_401() {
    let mut server = common::TestServer::with_config(code_executor::Config {
        token: Some("right-token".into()),
        ..common::config()
    })
    .await;
    // The suite's own checks (and recovery) carry the token.
    server.client = reqwest::Client::builder()
        .default_headers(
            [(
                reqwest::header::AUTHORIZATION,
                "Bearer right-token".parse().unwrap(),
            )]
            .into_iter()
            .collect(),
        )
        .build()
        .unwrap();
    let arena = Arena::from_server(server, 2).await;
    let anonymous = reqwest::Client::new();
    let body = br#"{"code": "print(1)"}"#.to_vec();
    let (s, b) = post_raw(&arena, body.clone(), None).await;
    assert_error(s, &b, 401, "unauthorized", "token");
    let (s, b) = post_raw(&arena, body.clone(), Some("wrong-token")).await;
    assert_error(s, &b, 401, "unauthorized", "token");
    let (s, b) = post_raw(&arena, body, Some("right-token")).await;
    assert_eq!(s, 200, "{b}");
    for path in ["/list-envs", "/list-packages"] {
        let resp = anonymous
            .get(format!("{}{path}", arena.server.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{path}");
    }
    let resp = anonymous
        .post(format!("{}/mcp", arena.server.url))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401, "/mcp");
    // /health stays open and names mechanisms, never the token.
    let (s, health) = arena.server.get("/health").await;
    assert_eq!(s, 200);
    assert!(!health.to_string().contains("right-token"), "{health}");
    assert_eq!(health["sandbox"]["landlock"], true, "{health}");
    assert_eq!(health["sandbox"]["network_namespace"], true, "{health}");
    assert_eq!(health["sandbox"]["pid_namespace"], true, "{health}");
    assert_eq!(health["sandbox"]["no_new_privs"], true, "{health}");
    drop(anonymous);
    arena.assert_recovered().await;
}

#[tokio::test]
async fn listening_beyond_loopback_needs_a_token_or_an_explicit_opt_out() {
    let args = code_executor::config::ServeArgs {
        host: Some("0.0.0.0".parse().unwrap()),
        ..Default::default()
    };
    let err = code_executor::Config::merge(&args, Default::default()).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("--insecure-no-auth"), "{message}");
    assert!(message.contains("--token"), "{message}");
    let with_token = code_executor::config::ServeArgs {
        token: Some("t".into()),
        ..args.clone()
    };
    assert!(code_executor::Config::merge(&with_token, Default::default()).is_ok());
    let opted_out = code_executor::config::ServeArgs {
        insecure_no_auth: true,
        ..args
    };
    assert!(code_executor::Config::merge(&opted_out, Default::default()).is_ok());
}

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

/// A plain TCP connection to the arena's server, reads bounded by `secs`.
fn connect(arena: &Arena, secs: u64) -> std::net::TcpStream {
    let address = arena.server.url.trim_start_matches("http://");
    let stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(secs)))
        .unwrap();
    stream
}

/// The head of a `POST /execute` with a JSON body of `length` bytes.
fn post_head(length: u64) -> String {
    format!(
        "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
}

/// One HTTP/1.1 exchange on `stream`: writes `head` and `body`, then
/// reads the answer's status line and body (by its `Content-Length`).
fn exchange(stream: &mut std::net::TcpStream, head: &str, body: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    stream.write_all(head.as_bytes()).expect("head written");
    for chunk in body.chunks(1 << 20) {
        stream.write_all(chunk).expect("body written whole");
    }
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).expect("answer read");
        assert_eq!(
            n,
            1,
            "connection closed after {:?}",
            String::from_utf8_lossy(&got)
        );
        got.push(byte[0]);
    }
    let head = String::from_utf8(got).unwrap().to_ascii_lowercase();
    let status = head[9..12].parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .expect("content-length")
        .trim()
        .parse()
        .unwrap();
    let mut answer = vec![0u8; length];
    stream.read_exact(&mut answer).expect("answer body");
    (status, String::from_utf8(answer).unwrap())
}

#[tokio::test]
async fn an_over_limit_body_is_drained_then_answered_413_on_a_live_connection() {
    let arena = Arena::start().await;
    let mut stream = connect(&arena, 30);
    let task = tokio::task::spawn_blocking(move || {
        // 40 MiB against the default 32 MiB limit, by its Content-Length.
        let body = vec![b'x'; 40 << 20];
        let (status, answer) = exchange(&mut stream, &post_head(body.len() as u64), &body);
        assert_eq!(status, 413, "{answer}");
        assert!(answer.contains("max_body_bytes"), "{answer}");
        // The same, chunked: no length up front.
        let mut chunked = Vec::new();
        for chunk in body.chunks(1 << 20) {
            chunked.extend(format!("{:x}\r\n", chunk.len()).as_bytes());
            chunked.extend(chunk);
            chunked.extend(b"\r\n");
        }
        chunked.extend(b"0\r\n\r\n");
        let head = "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        let (status, answer) = exchange(&mut stream, head, &chunked);
        assert_eq!(status, 413, "{answer}");
        // The connection still serves.
        let code = br#"{"code": "print(6*7)"}"#;
        let (status, answer) = exchange(&mut stream, &post_head(code.len() as u64), code);
        assert_eq!(status, 200, "{answer}");
        assert!(answer.contains(r#""stdout":"42\n""#), "{answer}");
    });
    task.await.expect("client thread");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn a_body_declared_far_over_the_limit_is_refused_before_it_is_sent() {
    let arena = Arena::start().await;
    let mut stream = connect(&arena, 10);
    let task = tokio::task::spawn_blocking(move || {
        // 1 GiB declared, nothing of it sent: the answer comes at once.
        let started = std::time::Instant::now();
        let (status, answer) = exchange(&mut stream, &post_head(1 << 30), b"");
        assert_eq!(status, 413, "{answer}");
        assert!(answer.contains("max_body_bytes"), "{answer}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "answered after {:?}",
            started.elapsed()
        );
        // And the connection is closed: the rest of that body never comes.
        let mut rest = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stream, &mut rest);
        assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    });
    task.await.expect("client thread");
    arena.assert_recovered().await;
}

#[tokio::test]
async fn code_and_files_over_their_limits_are_413s_naming_the_limit() {
    let arena = Arena::with_config(code_executor::Config {
        request_limits: code_executor::limits::RequestLimits {
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
async fn listening_beyond_loopback_without_a_token_makes_one_and_prints_it_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, address, mut logs) =
        crate::ops::spawn_server(&["--host", "0.0.0.0", "--pool-size", "1"], tmp.path()).await;
    let port = address.rsplit_once(':').unwrap().1;
    let url = format!("http://127.0.0.1:{port}/execute");
    // The token is printed once, inside a curl line ready to paste.
    let mut lines = Vec::new();
    let token = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Some(line) = logs.recv().await {
            lines.push(line.clone());
            if let Some(rest) = line.split("curl -H \"Authorization: Bearer ").nth(1) {
                let token = rest.split('"').next().unwrap().to_string();
                let tail =
                    format!("\" -d '{{\"code\":\"print(2+2)\"}}' http://127.0.0.1:{port}/execute");
                assert!(line.ends_with(&tail), "{line}");
                return token;
            }
        }
        panic!("no curl line in the log: {lines:#?}");
    })
    .await
    .expect("the token is logged after the ready line");
    assert_eq!(token.len(), 64, "{token}");
    let client = reqwest::Client::new();
    let anonymous = client
        .post(&url)
        .body(r#"{"code":"print(2+2)"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    // What the curl line sends (no content type: curl -d's form type).
    let resp = client
        .post(&url)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(r#"{"code":"print(2+2)"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap()["stdout"], "4\n");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().await.unwrap().success());
    while let Some(line) = logs.recv().await {
        lines.push(line);
    }
    let mentions = lines.iter().filter(|l| l.contains(&token)).count();
    assert_eq!(mentions, 1, "{lines:#?}");
}

#[test]
fn only_insecure_no_auth_serves_beyond_loopback_without_a_token() {
    let host = code_executor::config::HostEnv::default();
    let merge = |args: &code_executor::config::Options| {
        code_executor::Config::merge_with(args, Default::default(), host.clone()).unwrap()
    };
    let args = code_executor::config::Options {
        host: Some("0.0.0.0".parse().unwrap()),
        ..Default::default()
    };
    let generated = merge(&args);
    assert!(generated.token_generated && generated.token.is_some());
    let with_token = code_executor::config::Options {
        token: Some("t".into()),
        ..args.clone()
    };
    assert_eq!(merge(&with_token).token.as_deref(), Some("t"));
    let opted_out = code_executor::config::Options {
        insecure_no_auth: Some(true),
        ..args
    };
    assert_eq!(merge(&opted_out).token, None);
}

//! Both MCP revisions on one endpoint, and the stdio cold start: the
//! stateless 2026-07-28 revision (no `initialize`; every request carries
//! its version and capabilities, and may come on a new connection) beside
//! the stateful 2025-11-25 one the other MCP tests speak.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, TestServer};
use crate::mcp::{marked_sleeper, unique_marker, wait_for_process, wait_until_gone};

const STATELESS: &str = "2026-07-28";

/// One stateless request on a connection of its own; the JSON-RPC answer.
async fn stateless(server: &TestServer, id: u64, method: &str, params: Value) -> Value {
    stateless_at(&format!("{}/mcp", server.url), None, id, method, params)
        .await
        .0
}

/// A stateless request to the MCP endpoint `url`, with `cookie` if given;
/// the JSON-RPC answer and the `Set-Cookie` header of the response.
pub(crate) async fn stateless_at(
    url: &str,
    cookie: Option<&str>,
    id: u64,
    method: &str,
    mut params: Value,
) -> (Value, Option<String>) {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": STATELESS,
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let mut req = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", STATELESS)
        .header("Mcp-Method", method);
    if let Some(name) = params["name"].as_str() {
        req = req.header("Mcp-Name", name);
    }
    if let Some(cookie) = cookie {
        req = req.header("cookie", cookie);
    }
    let resp = req
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{method}");
    let set_cookie = resp
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or(v).to_string());
    let body = resp.text().await.unwrap();
    let data = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .find(|l| l.contains("\"id\""))
        .unwrap_or_else(|| panic!("no answer in {body}"));
    (serde_json::from_str(data).unwrap(), set_cookie)
}

#[tokio::test]
async fn the_stateless_revision_needs_no_initialize_and_keeps_sessions_by_handle() {
    let server = TestServer::start().await;
    let discover = stateless(&server, 1, "server/discover", json!({})).await;
    let versions = discover["result"]["supportedVersions"].as_array().unwrap();
    assert!(versions.contains(&json!(STATELESS)), "{discover}");
    assert!(versions.contains(&json!("2025-11-25")), "{discover}");
    assert!(discover["result"]["capabilities"]["tools"].is_object());
    assert!(discover["result"]["capabilities"]["resources"].is_object());
    let tools = stateless(&server, 2, "tools/list", json!({})).await;
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"execute_code"), "{names:?}");
    let call = |id, args: Value| {
        let server = &server;
        async move {
            stateless(
                server,
                id,
                "tools/call",
                json!({"name": "execute_code", "arguments": args}),
            )
            .await
        }
    };
    let ran = call(3, json!({"code": "print(2+2)"})).await;
    assert_eq!(ran["result"]["structuredContent"]["stdout"], "4\n", "{ran}");
    // A session is an explicit handle: it carries over across requests on
    // connections of their own.
    let created = stateless(
        &server,
        4,
        "tools/call",
        json!({"name": "create_session", "arguments": {}}),
    )
    .await;
    let id = created["result"]["structuredContent"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    call(5, json!({"code": "v = 42", "session": id})).await;
    let read = call(6, json!({"code": "print(v)", "session": id})).await;
    assert_eq!(
        read["result"]["structuredContent"]["stdout"], "42\n",
        "{read}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_stateless_request_whose_client_leaves_kills_its_run() {
    let server = TestServer::start().await;
    let marker = unique_marker("stateless-gone");
    let request = stateless(
        &server,
        1,
        "tools/call",
        json!({"name": "execute_code", "arguments": {"code": marked_sleeper(&marker), "timeout": 60}}),
    );
    tokio::select! {
        answer = request => panic!("the sleeper answered: {answer}"),
        _ = wait_for_process(&marker, Duration::from_secs(10)) => {}
    }
    let gone = wait_until_gone(marker.as_ref(), Duration::from_secs(5)).await;
    assert!(gone < Duration::from_secs(2), "killed only after {gone:?}");
    let ran = stateless(
        &server,
        2,
        "tools/call",
        json!({"name": "execute_code", "arguments": {"code": "print('after')"}}),
    )
    .await;
    assert_eq!(ran["result"]["structuredContent"]["stdout"], "after\n");
    server.stop().await;
}

#[tokio::test]
async fn stdio_answers_initialize_at_once_and_its_first_call_is_right() {
    // A pool of four: initialize waits for none of them, the first call for
    // one.
    let python = common::python();
    let started = Instant::now();
    let (client, mut child) = crate::common::mcp::connect_stdio(
        std::path::Path::new(env!("CARGO_BIN_EXE_code-executor")),
        &["--python", python.to_str().unwrap(), "--pool-size", "4"],
        &[],
    )
    .await;
    let handshake = started.elapsed();
    let out = crate::common::mcp::execute_code(&client, json!({"code": "print(2+2)"}))
        .await
        .unwrap();
    assert_eq!(crate::common::mcp::text(&out), "4\n[exit code 0]");
    // The rest of the pool still comes up.
    for i in 0..4 {
        let out = crate::common::mcp::execute_code(&client, json!({"code": format!("print({i})")}))
            .await
            .unwrap();
        assert_eq!(
            crate::common::mcp::text(&out),
            format!("{i}\n[exit code 0]")
        );
    }
    assert!(handshake < Duration::from_secs(30), "{handshake:?}");
    drop(client);
    let _ = child.kill().await;
}

/// A stdio client that sends `execute_code` with a progress token and then
/// reads nothing for a while: its run still ends at its timeout, and the
/// client then reads every notification before the result.
#[tokio::test]
async fn a_client_slow_to_read_progress_does_not_hold_the_run_past_its_timeout() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let python = common::python();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_code-executor"))
        .args([
            "mcp",
            "--python",
            python.to_str().unwrap(),
            "--pool-size",
            "1",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the server starts");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = async |message: Value| {
        let mut line = message.to_string();
        line.push('\n');
        stdin.write_all(line.as_bytes()).await.unwrap();
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "slow", "version": "1"}}}),
    )
    .await;
    let init: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
    assert!(init["result"].is_object(), "{init}");
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    // Output without end, far more than a pipe holds.
    let code = "import sys\nwhile True:\n    sys.stdout.write('x' * 4000 + '\\n')\n    sys.stdout.flush()\n";
    send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "execute_code", "_meta": {"progressToken": "p"},
        "arguments": {"code": code, "timeout": 2}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(7)).await;

    let mut notifications = 0;
    let result = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the answer comes")
            .unwrap()
            .expect("the server stays");
        let message: Value = serde_json::from_str(&line).unwrap();
        if message["id"] == 2 {
            break message;
        }
        assert_eq!(message["method"], "notifications/progress", "{message}");
        notifications += 1;
    };
    let structured = &result["result"]["structuredContent"];
    assert_eq!(structured["timed_out"], true, "{result}");
    assert_eq!(structured["truncated"], true, "{result}");
    // Killed at its 2 s timeout, not when the client read again at 7 s.
    let wall_ms = structured["duration_ms"].as_f64().unwrap();
    assert!(wall_ms < 5000.0, "ran {wall_ms} ms");
    assert!(notifications > 1, "{notifications}");
    drop(stdin);
    let _ = child.kill().await;
}

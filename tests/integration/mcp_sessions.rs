//! Sessions over MCP: `create_session` / `close_session`, `session` on
//! `execute_code`, and the optional implicit session per connection (in
//! process and over streamable HTTP).

use std::sync::Arc;
use std::time::{Duration, Instant};

use code_executor::Executor;
use serde_json::json;

use crate::common::mcp::{
    McpClient, call, connect_http, connect_in_process, connect_stdio, execute_code, text,
};
use crate::common::{TestServer, config};

async fn wait_for_sessions(executor: &Executor, count: usize) {
    let start = Instant::now();
    while executor.list_sessions().len() != count {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "sessions: {:?}",
            executor.list_sessions()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run(client: &McpClient, args: serde_json::Value) -> (bool, String) {
    let out = execute_code(client, args)
        .await
        .expect("tool call answered");
    (out.is_error == Some(true), text(&out))
}

#[tokio::test]
async fn session_tools_keep_state_until_closed() {
    let config = config();
    let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
    let client = connect_in_process(executor.clone(), &config).await;
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert!(
        names.contains(&"create_session") && names.contains(&"close_session"),
        "{names:?}"
    );

    let created = call(&client, "create_session", json!({})).await.unwrap();
    assert_ne!(created.is_error, Some(true), "{created:?}");
    let id = created.structured_content.as_ref().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (failed, _) = run(
        &client,
        json!({"code": "import math\nr = math.sqrt(16)", "session": id}),
    )
    .await;
    assert!(!failed);
    let (failed, out) = run(&client, json!({"code": "print(r)", "session": id})).await;
    assert!(!failed, "{out}");
    assert!(out.starts_with("4.0\n"), "{out}");
    // A clean call does not see the session.
    let (failed, out) = run(&client, json!({"code": "print(r)"})).await;
    assert!(failed && out.contains("NameError"), "{out}");

    // A timeout interrupts the call and the state stays.
    let (failed, out) = run(
        &client,
        json!({"code": "import time\nwhile True: time.sleep(0.01)", "session": id, "timeout": 0.5}),
    )
    .await;
    assert!(failed && out.contains("kept its state"), "{out}");

    let closed = call(&client, "close_session", json!({"session": id}))
        .await
        .unwrap();
    assert_ne!(closed.is_error, Some(true), "{}", text(&closed));
    let (failed, out) = run(&client, json!({"code": "print(r)", "session": id})).await;
    assert!(failed && out.contains("unknown_session"), "{out}");
    let again = call(&client, "close_session", json!({"session": id}))
        .await
        .unwrap();
    assert_eq!(again.is_error, Some(true));
    let _ = client.cancel().await;
    executor.shutdown().await;
}

#[tokio::test]
async fn implicit_sessions_are_one_per_connection_and_end_with_it() {
    let mut config = config();
    config.mcp_implicit_session = true;
    let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
    let first = connect_in_process(executor.clone(), &config).await;
    let second = connect_in_process(executor.clone(), &config).await;
    let tools = first.list_all_tools().await.unwrap();
    let description = tools
        .iter()
        .find(|t| t.name == "execute_code")
        .unwrap()
        .description
        .clone()
        .unwrap();
    assert!(
        description.contains("persistent Python session"),
        "{description}"
    );

    let (failed, _) = run(&first, json!({"code": "who = 'first'"})).await;
    assert!(!failed);
    let (failed, out) = run(&first, json!({"code": "print(who)"})).await;
    assert!(!failed && out.starts_with("first\n"), "{out}");
    let (failed, out) = run(&second, json!({"code": "print(who)"})).await;
    assert!(failed && out.contains("NameError"), "{out}");
    wait_for_sessions(&executor, 2).await;

    // A lost implicit session is replaced, and the call says so.
    let (_, out) = run(&first, json!({"code": "import os\nos._exit(1)"})).await;
    assert!(out.contains("session lost"), "{out}");
    let (failed, out) = run(&first, json!({"code": "print('who' in globals())"})).await;
    assert!(
        !failed && out.contains("previous session was lost") && out.contains("False"),
        "{out}"
    );
    // The lost one is gone, its replacement and the second connection's remain.
    wait_for_sessions(&executor, 2).await;

    let _ = first.cancel().await;
    wait_for_sessions(&executor, 1).await;
    let _ = second.cancel().await;
    wait_for_sessions(&executor, 0).await;
    executor.shutdown().await;
}

/// A call that names an environment runs in the connection's session in
/// that environment, never refused for the session of another one.
#[tokio::test]
async fn implicit_sessions_are_one_per_environment_a_connection_names() {
    let fixture = crate::audit::two_envs();
    let mut config = crate::audit::config_over(&fixture);
    config.mcp_implicit_session = true;
    let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
    let client = connect_in_process(executor.clone(), &config).await;

    let (failed, out) = run(&client, json!({"code": "who = 'a'", "env": "a"})).await;
    assert!(!failed, "{out}");
    let (failed, out) = run(&client, json!({"code": "print(who)", "env": "a"})).await;
    assert!(!failed && out.starts_with("a\n"), "{out}");
    let (failed, out) = run(&client, json!({"code": "who = 'b'", "env": "b"})).await;
    assert!(!failed, "{out}");
    let (failed, out) = run(&client, json!({"code": "print(who)", "env": "a"})).await;
    assert!(!failed && out.starts_with("a\n"), "{out}");
    let (failed, out) = run(&client, json!({"code": "print(who)", "env": "b"})).await;
    assert!(!failed && out.starts_with("b\n"), "{out}");
    // Named by its prefix, an environment is the same one: its session.
    let prefix = fixture.root.join("envs/a");
    let (failed, out) = run(
        &client,
        json!({"code": "print(who)", "env": prefix.to_str().unwrap()}),
    )
    .await;
    assert!(!failed && out.starts_with("a\n"), "{out}");
    let envs: Vec<String> = executor
        .list_sessions()
        .into_iter()
        .map(|s| s.env)
        .collect();
    assert_eq!(envs, ["a", "b"]);

    let _ = client.cancel().await;
    wait_for_sessions(&executor, 0).await;
    executor.shutdown().await;
}

#[tokio::test]
async fn the_call_right_after_a_cancelled_one_gets_a_new_implicit_session() {
    // Over stdio, as an MCP client launches the server.
    let tmp = tempfile::tempdir().unwrap();
    let python = crate::common::python();
    let (client, mut child) = connect_stdio(
        env!("CARGO_BIN_EXE_code-executor").as_ref(),
        &[
            "--python",
            python.to_str().unwrap(),
            "--pool-size",
            "2",
            "--mcp-implicit-session",
            "true",
        ],
        &[("TMPDIR", tmp.path())],
    )
    .await;
    for round in 0..8 {
        let (failed, out) = run(&client, json!({"code": "kept = 1"})).await;
        assert!(!failed, "round {round}: {out}");
        // Dropping rmcp's call future sends notifications/cancelled; the
        // next call goes out at once, while the cancelled one still ends.
        let cancelled = tokio::time::timeout(
            Duration::from_millis(300),
            execute_code(&client, json!({"code": "import time\ntime.sleep(30)"})),
        )
        .await;
        assert!(cancelled.is_err(), "round {round}: the sleeper finished");
        let (failed, out) = run(&client, json!({"code": "print('kept' in globals())"})).await;
        assert!(
            !failed && out.contains("previous session was lost") && out.contains("False"),
            "round {round}: {out}"
        );
    }
    let _ = client.cancel().await;
    let _ = tokio::time::timeout(Duration::from_secs(15), child.wait()).await;
}

#[tokio::test]
async fn implicit_sessions_over_streamable_http() {
    let mut config = config();
    config.mcp_implicit_session = true;
    let server = TestServer::with_config(config).await;
    let url = format!("{}/mcp", server.url);
    let a = connect_http(&url, None).await;
    let b = connect_http(&url, None).await;
    run(&a, json!({"code": "n = 1"})).await;
    run(&b, json!({"code": "n = 2"})).await;
    let (_, out_a) = run(&a, json!({"code": "print(n)"})).await;
    let (_, out_b) = run(&b, json!({"code": "print(n)"})).await;
    assert!(
        out_a.starts_with("1\n") && out_b.starts_with("2\n"),
        "{out_a} / {out_b}"
    );
    let _ = a.cancel().await;
    let _ = b.cancel().await;
    server.stop().await;
}

/// The status line names the timeout the call ran under: a session's own
/// default, not the server's.
#[tokio::test]
async fn a_session_calls_status_line_names_the_sessions_timeout() {
    let config = config();
    assert_ne!(config.timeout, 1.0);
    let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
    let client = connect_in_process(executor.clone(), &config).await;
    let created = call(&client, "create_session", json!({"timeout": 1}))
        .await
        .unwrap();
    let id = created.structured_content.as_ref().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (failed, out) = run(&client, json!({"code": "while True: pass", "session": id})).await;
    assert!(failed, "{out}");
    assert!(out.contains("timed out after 1 s"), "{out}");
    let _ = client.cancel().await;
    executor.shutdown().await;
}

/// A call to a session that does not exist says how to open one the MCP
/// way (the tool), not with the HTTP API's route; so does the cap on live
/// sessions, about closing one.
#[tokio::test]
async fn session_errors_name_the_session_tools() {
    let mut config = config();
    config.sessions.max_sessions = 1;
    let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
    let client = connect_in_process(executor.clone(), &config).await;
    let (failed, out) = run(&client, json!({"code": "pass", "session": "nope"})).await;
    assert!(failed, "{out}");
    assert_eq!(
        out,
        "error (unknown_session): unknown session \"nope\"; create one with the `create_session` \
         tool"
    );
    let closed = call(&client, "close_session", json!({"session": "nope"}))
        .await
        .unwrap();
    assert_eq!(closed.is_error, Some(true));
    assert_eq!(text(&closed), out);

    let first = call(&client, "create_session", json!({})).await.unwrap();
    assert_ne!(first.is_error, Some(true), "{}", text(&first));
    // What only a session's creation sets is refused in the tools' terms.
    let id = first.structured_content.as_ref().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    for (field, value) in [
        ("limits", json!({"memory_bytes": 100_000_000})),
        ("network", json!({"allowed_hosts": []})),
    ] {
        let (failed, out) = run(
            &client,
            json!({"code": "pass", "session": id, field: value}),
        )
        .await;
        assert!(failed, "{out}");
        assert!(
            out.starts_with("error (bad_request): ")
                && out.contains("`create_session`")
                && out.contains(&format!("omit `{field}`"))
                && !out.contains("POST /sessions"),
            "{out}"
        );
    }
    let second = call(&client, "create_session", json!({})).await.unwrap();
    assert_eq!(second.is_error, Some(true), "{}", text(&second));
    assert_eq!(
        text(&second),
        "error (too_many_sessions): the server already runs its maximum of 1 sessions; close one \
         with the `close_session` tool or wait for one to expire"
    );
    let _ = client.cancel().await;
    executor.shutdown().await;
}

/// A call naming a session that does not exist is told so first, as over
/// HTTP, even when it also sends `limits` or `network` (which a session
/// call would be refused): the session is what the client must fix. With
/// implicit sessions on, too.
#[tokio::test]
async fn an_unknown_session_is_named_before_the_calls_limits_or_network() {
    for implicit in [false, true] {
        let mut config = config();
        config.mcp_implicit_session = implicit;
        let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
        let client = connect_in_process(executor.clone(), &config).await;
        for (field, value) in [
            ("limits", json!({"memory_bytes": 100_000_000})),
            ("network", json!({"allowed_hosts": []})),
        ] {
            let (failed, out) = run(
                &client,
                json!({"code": "pass", "session": "nope", field: value}),
            )
            .await;
            assert!(failed, "{out}");
            assert_eq!(
                out,
                "error (unknown_session): unknown session \"nope\"; create one with the \
                 `create_session` tool",
                "implicit {implicit}, {field}"
            );
        }
        let _ = client.cancel().await;
        executor.shutdown().await;
    }
}

/// `create_session` refuses a ttl under a millisecond as `POST /sessions`
/// does; a tiny timeout is taken, and reads as a number, not 300 zeros.
#[tokio::test]
async fn create_session_refuses_a_ttl_under_a_millisecond() {
    let config = config();
    let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
    let client = connect_in_process(executor.clone(), &config).await;
    let refused = call(&client, "create_session", json!({"ttl": 1e-9}))
        .await
        .unwrap();
    assert_eq!(refused.is_error, Some(true), "{}", text(&refused));
    assert_eq!(
        text(&refused),
        "error (bad_request): ttl must be a positive number of seconds, at least 0.001 (session \
         times are kept to the millisecond), got 1e-9"
    );
    let created = call(
        &client,
        "create_session",
        json!({"ttl": 0.5, "timeout": 1e-300}),
    )
    .await
    .unwrap();
    assert_ne!(created.is_error, Some(true), "{}", text(&created));
    assert!(
        text(&created).ends_with("(ends after 0.5 s without a call)"),
        "{}",
        text(&created)
    );
    let id = created.structured_content.as_ref().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (failed, out) = run(
        &client,
        json!({"code": "import time; time.sleep(5)", "session": id}),
    )
    .await;
    assert!(failed, "{out}");
    assert!(out.contains("[timed out after 1e-300 s]"), "{out}");
    let _ = client.cancel().await;
    executor.shutdown().await;
}

/// The `execute_code` description a `tools/list` answer carries.
fn execute_code_description(tools: &[serde_json::Value]) -> String {
    tools
        .iter()
        .find(|t| t["name"] == "execute_code")
        .and_then(|t| t["description"].as_str())
        .unwrap_or_else(|| panic!("no execute_code in {tools:?}"))
        .to_string()
}

/// With implicit sessions on, only a client whose calls share a connection
/// (an MCP session over HTTP) is told that state carries over; a client of
/// the stateless revision, whose calls cannot share one, is told each call
/// starts clean and to keep state with `create_session` — and that is what
/// its calls do.
#[tokio::test]
async fn implicit_sessions_are_promised_only_where_calls_share_a_connection() {
    let mut config = config();
    config.mcp_implicit_session = true;
    let server = TestServer::with_config(config).await;
    let url = format!("{}/mcp", server.url);

    let stateful = connect_http(&url, None).await;
    let instructions = stateful
        .peer_info()
        .and_then(|info| info.instructions.clone())
        .unwrap_or_default();
    assert!(
        instructions.contains("every call of this connection runs in one persistent session"),
        "{instructions}"
    );
    let tools = stateful.list_all_tools().await.unwrap();
    let tools: Vec<serde_json::Value> = tools
        .iter()
        .map(|t| serde_json::to_value(t).unwrap())
        .collect();
    let description = execute_code_description(&tools);
    assert!(
        description.contains("All calls of this connection share one persistent Python session"),
        "{description}"
    );
    run(&stateful, json!({"code": "kept = 1"})).await;
    let (failed, out) = run(&stateful, json!({"code": "print(kept)"})).await;
    assert!(!failed && out.starts_with("1\n"), "{out}");
    let _ = stateful.cancel().await;

    let stateless = async |id, method: &str, params| {
        crate::mcp_protocol::stateless_at(&url, None, id, method, params)
            .await
            .0
    };
    let discover = stateless(1, "server/discover", json!({})).await;
    let instructions = discover["result"]["instructions"].as_str().unwrap_or("");
    assert!(
        instructions.contains(
            "every call starts from a clean state (no variables, imports or files carry over) \
             unless it names a session from `create_session`"
        ),
        "{discover}"
    );
    assert!(!instructions.contains("persistent"), "{instructions}");
    let tools = stateless(2, "tools/list", json!({})).await;
    let description = execute_code_description(tools["result"]["tools"].as_array().unwrap());
    assert!(
        description.contains(
            "Every call starts from a clean state: no variables, imports or files carry over"
        ) && description.contains("create a session with `create_session`"),
        "{description}"
    );
    assert!(!description.contains("persistent"), "{description}");
    let call = |id, code: &str| {
        stateless(
            id,
            "tools/call",
            json!({"name": "execute_code", "arguments": {"code": code}}),
        )
    };
    call(3, "kept = 1").await;
    let read = call(4, "print(kept)").await;
    assert_eq!(read["result"]["isError"], true, "{read}");
    assert!(
        read["result"]["structuredContent"]["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("NameError")),
        "{read}"
    );
    server.stop().await;
}

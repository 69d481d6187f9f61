//! MCP with rmcp's own client: in process for the tools, over the real
//! binary's stdio for its lifecycle, over streamable HTTP for `/mcp`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use code_executor::Executor;
use serde_json::{Value, json};

use crate::common::mcp::{
    McpClient, call, connect_http, connect_in_process, connect_stdio, execute_code, text,
};
use crate::common::{TestServer, config, processes_mentioning, python};

/// An executor with the test config and an rmcp client connected to it.
async fn start() -> (McpClient, Arc<Executor>) {
    let config = config();
    let executor = Arc::new(Executor::start(&config).await.expect("executor starts"));
    (
        connect_in_process(executor.clone(), &config).await,
        executor,
    )
}

async fn stop(client: McpClient, executor: Arc<Executor>) {
    let _ = client.cancel().await;
    executor.shutdown().await;
}

/// Python code that starts a grandchild whose command line holds `marker`,
/// then sleeps: a run that only ends when it is killed.
pub(crate) fn marked_sleeper(marker: &str) -> String {
    format!(
        "import subprocess, sys, time\n\
         subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'])\n\
         time.sleep(120)\n"
    )
}

/// Wait until a process mentioning `marker` runs; panics after `within`.
pub(crate) async fn wait_for_process(marker: &str, within: Duration) {
    let start = Instant::now();
    while processes_mentioning(marker.as_ref()).is_empty() {
        assert!(start.elapsed() < within, "the run never started {marker}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until no process mentions `needle`; how long that took.
pub(crate) async fn wait_until_gone(needle: &std::path::Path, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let left = processes_mentioning(needle);
        if left.is_empty() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "processes still running {within:?} later: {left:?} ({})",
            needle.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn unique_marker(what: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "mcp-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

#[tokio::test]
async fn initialize_and_tools_list_describe_the_server() {
    let (client, executor) = start().await;
    let info = client.peer_info().expect("server info after initialize");
    let default_env = executor.default_env().to_string();
    let server = info.server_info.as_ref().expect("serverInfo");
    assert_eq!(server.name, "code-executor");
    let instructions = info.instructions.clone().unwrap_or_default();
    assert!(
        instructions.contains(&format!("default environment is `{default_env}`")),
        "{instructions}"
    );

    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "close_session",
            "create_session",
            "execute_code",
            "grade_code",
            "list_environments",
            "list_packages"
        ]
    );

    let exec = tools.iter().find(|t| t.name == "execute_code").unwrap();
    let input = Value::Object((*exec.input_schema).clone());
    assert_eq!(input["required"], json!(["code"]));
    for field in ["code", "env", "timeout", "files", "stdin"] {
        assert!(
            input["properties"][field].is_object(),
            "no {field} in {input}"
        );
    }
    assert_eq!(input["additionalProperties"], false);
    let output = Value::Object((*exec.output_schema.clone().expect("outputSchema")).clone());
    for field in [
        "stdout",
        "stderr",
        "exit_code",
        "timed_out",
        "truncated",
        "duration_ms",
    ] {
        assert!(
            output["properties"][field].is_object(),
            "no {field} in {output}"
        );
    }
    let description = exec.description.as_deref().unwrap_or("");
    assert!(
        description.contains(&format!("`{default_env}`")),
        "{description}"
    );
    assert!(description.contains("clean state"), "{description}");
    assert!(description.contains("30 s wall clock"), "{description}");

    let list = tools
        .iter()
        .find(|t| t.name == "list_environments")
        .unwrap();
    assert!(list.output_schema.is_some());
    stop(client, executor).await;
}

#[tokio::test]
async fn execute_code_returns_text_and_structured_result() {
    let (client, executor) = start().await;
    let result = execute_code(&client, json!({"code": "print(2+2)"}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false));
    assert_eq!(text(&result), "4\n[exit code 0]");
    let structured = result.structured_content.expect("structuredContent");
    assert_eq!(structured["stdout"], "4\n");
    assert_eq!(structured["stderr"], "");
    assert_eq!(structured["exit_code"], 0);
    assert_eq!(structured["timed_out"], false);

    let result = execute_code(
        &client,
        json!({
            "code": "import sys\nprint(open('data/in.txt').read(), sys.stdin.read())",
            "files": {"data/in.txt": "from file"},
            "stdin": "from stdin",
        }),
    )
    .await
    .unwrap();
    assert_eq!(text(&result), "from file from stdin\n[exit code 0]");
    stop(client, executor).await;
}

#[tokio::test]
async fn failing_code_is_a_tool_error_with_the_traceback() {
    let (client, executor) = start().await;
    let result = execute_code(&client, json!({"code": "def f(:\n    pass\n"}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(true));
    let shown = text(&result);
    assert!(shown.starts_with("[stderr]\n"), "{shown}");
    assert!(shown.contains("SyntaxError"), "{shown}");
    assert!(shown.ends_with("[exit code 1]"), "{shown}");

    let result = execute_code(&client, json!({"code": "print('before')\n1/0"}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(true));
    let shown = text(&result);
    assert!(shown.starts_with("before\n[stderr]\nTraceback"), "{shown}");
    assert!(
        shown.contains("ZeroDivisionError: division by zero"),
        "{shown}"
    );
    assert!(shown.ends_with("[exit code 1]"), "{shown}");
    assert_eq!(result.structured_content.unwrap()["exit_code"], 1);
    stop(client, executor).await;
}

#[tokio::test]
async fn timeout_is_a_tool_error_naming_the_limit() {
    let (client, executor) = start().await;
    let started = Instant::now();
    let result = execute_code(&client, json!({"code": "while True: pass", "timeout": 1}))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(result.is_error, Some(true));
    assert_eq!(text(&result), "(no output)\n[timed out after 1 s]");
    let structured = result.structured_content.unwrap();
    assert_eq!(structured["timed_out"], true);
    assert_eq!(structured["limit"], "timeout");
    stop(client, executor).await;
}

#[tokio::test]
async fn refused_requests_are_tool_errors_with_the_reason() {
    let (client, executor) = start().await;
    let default_env = executor.default_env().to_string();

    let result = execute_code(&client, json!({"code": "print(1)", "env": "no-such-env"}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(true));
    assert!(result.structured_content.is_none());
    assert_eq!(
        text(&result),
        format!(
            "error (unknown_env): unknown environment \"no-such-env\"; \
             known environments: {default_env}"
        )
    );

    let result = execute_code(&client, json!({"code": "print(1)", "timeout": -1}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(true));
    assert!(text(&result).starts_with("error (bad_request): timeout must be a positive"));

    let result = execute_code(&client, json!({"cod": "print(1)"}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(true));
    assert!(
        text(&result).contains("unknown field `cod`"),
        "{}",
        text(&result)
    );

    // A tool that does not exist is a protocol fault.
    let err = call(&client, "no_such_tool", json!({})).await.unwrap_err();
    assert!(err.to_string().contains("tool not found"), "{err}");

    // None of this cost a worker.
    assert_eq!(executor.list_envs()[0].pool.size, 2);
    stop(client, executor).await;
}

/// Arguments the tool's type refuses read as every other refusal:
/// `error (bad_request): ...`, naming the argument, with serde's reason.
#[tokio::test]
async fn refused_arguments_name_the_argument_in_the_error_format() {
    let (client, executor) = start().await;
    let refused = async |tool: &str, args: Value| {
        let out = call(&client, tool, args).await.unwrap();
        assert_eq!(out.is_error, Some(true), "{out:?}");
        assert!(out.structured_content.is_none(), "{out:?}");
        text(&out)
    };
    let shown = refused("execute_code", json!({"code": "print(1)", "timeout": "5"})).await;
    assert_eq!(
        shown,
        "error (bad_request): invalid argument `timeout`: invalid type: string \"5\", expected f64"
    );
    let shown = refused("execute_code", json!({"code": "print(1)", "cod": 1})).await;
    assert!(
        shown.starts_with(
            "error (bad_request): invalid argument `cod`: unknown field `cod`, expected one of \
             `code`, "
        ),
        "{shown}"
    );
    let shown = refused(
        "execute_code",
        json!({"code": "pass", "limits": {"memory_bytes": "x"}}),
    )
    .await;
    assert!(
        shown.starts_with("error (bad_request): invalid argument `limits.memory_bytes`: invalid type: string \"x\""),
        "{shown}"
    );
    let shown = refused("execute_code", json!({})).await;
    assert_eq!(
        shown,
        "error (bad_request): invalid arguments: missing field `code`"
    );
    let shown = refused("create_session", json!({"ttl": [1]})).await;
    assert!(
        shown.starts_with("error (bad_request): invalid argument `ttl`: invalid type: sequence"),
        "{shown}"
    );
    let shown = refused("list_environments", json!({"env": "x"})).await;
    assert!(
        shown.starts_with("error (bad_request): invalid argument `env`: unknown field `env`"),
        "{shown}"
    );
    // Counted as refused calls (`error`), as other refusals are.
    let metrics = executor.metrics().render();
    assert!(
        metrics.contains("tool=\"execute_code\",outcome=\"error\"} 4"),
        "{metrics}"
    );
    stop(client, executor).await;
}

#[tokio::test]
async fn list_environments_shows_the_default_env() {
    let (client, executor) = start().await;
    let result = call(&client, "list_environments", json!({})).await.unwrap();
    assert_eq!(result.is_error, Some(false));
    let default_env = executor.default_env().to_string();
    let shown = text(&result);
    assert!(
        shown.starts_with(&format!("{default_env} (default): Python 3.")),
        "{shown}"
    );
    let envs = &result.structured_content.unwrap()["envs"];
    assert_eq!(envs[0]["name"], default_env.as_str());
    assert_eq!(envs[0]["default"], true);
    assert!(envs[0]["prefix"].as_str().is_some_and(|p| !p.is_empty()));
    // No arguments at all is the same call; an argument is refused, not
    // ignored, as for every tool.
    let bare = client
        .call_tool(rmcp::model::CallToolRequestParams::new("list_environments"))
        .await
        .unwrap();
    assert_eq!(bare.is_error, Some(false), "{bare:?}");
    assert_eq!(text(&bare), shown);
    let result = call(&client, "list_environments", json!({"env": "x"}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(true), "{result:?}");
    assert!(
        text(&result).contains("unknown field `env`"),
        "{}",
        text(&result)
    );
    stop(client, executor).await;
}

#[tokio::test]
async fn cancelling_a_call_kills_the_run() {
    let (client, executor) = start().await;
    let marker = unique_marker("cancel");
    let call = execute_code(
        &client,
        json!({"code": marked_sleeper(&marker), "timeout": 60}),
    );
    // Dropping rmcp's call future sends notifications/cancelled.
    let outcome = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! {
            _ = call => panic!("the sleeper finished"),
            _ = wait_for_process(&marker, Duration::from_secs(5)) => {}
        }
    })
    .await;
    assert!(outcome.is_ok(), "the run never started");
    let gone_after = wait_until_gone(marker.as_ref(), Duration::from_secs(5)).await;
    assert!(
        gone_after < Duration::from_secs(2),
        "killed only after {gone_after:?}"
    );

    // The worker answered the cancel: the next call works and the pool is whole.
    let result = execute_code(&client, json!({"code": "print('alive')"}))
        .await
        .unwrap();
    assert_eq!(text(&result), "alive\n[exit code 0]");
    let start = Instant::now();
    while executor.list_envs()[0].pool.size != 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "pool not refilled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(executor.health().status, "ok");
    stop(client, executor).await;
}

#[tokio::test]
async fn stdio_server_exits_cleanly_on_stdin_eof() {
    let tmp = tempfile::tempdir().unwrap();
    let python = python();
    let (client, mut child) = connect_stdio(
        env!("CARGO_BIN_EXE_code-executor").as_ref(),
        &["--python", python.to_str().unwrap(), "--pool-size", "2"],
        &[("TMPDIR", tmp.path())],
    )
    .await;
    let result = execute_code(&client, json!({"code": "print(2+2)"}))
        .await
        .unwrap();
    assert_eq!(text(&result), "4\n[exit code 0]");
    assert!(
        !processes_mentioning(tmp.path()).is_empty(),
        "workers live under TMPDIR"
    );

    // A run still in flight when the client goes away is killed too.
    let marker = unique_marker("stdio-eof");
    let peer = client.peer().clone();
    let in_flight = tokio::spawn({
        let code = marked_sleeper(&marker);
        async move {
            let args = json!({"code": code, "timeout": 60});
            let Value::Object(args) = args else {
                unreachable!()
            };
            peer.call_tool(
                rmcp::model::CallToolRequestParams::new("execute_code").with_arguments(args),
            )
            .await
        }
    });
    wait_for_process(&marker, Duration::from_secs(5)).await;

    // Closing the client closes the server's stdin.
    let _ = client.cancel().await;
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("server exits after stdin EOF")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(
        in_flight.await.unwrap().is_err(),
        "the in-flight call got no answer"
    );
    wait_until_gone(marker.as_ref(), Duration::from_secs(2)).await;
    wait_until_gone(tmp.path(), Duration::from_secs(2)).await;
}

#[tokio::test]
async fn streamable_http_serves_concurrent_calls_behind_the_token() {
    let server = TestServer::with_config(code_executor::Config {
        token: Some("s3cret".into()),
        ..config()
    })
    .await;
    let url = format!("{}/mcp", server.url);
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}
    });
    for auth in [None, Some("Bearer wrong")] {
        let mut req = server
            .client
            .post(&url)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize);
        if let Some(auth) = auth {
            req = req.header("authorization", auth);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401, "{auth:?}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized");
    }

    let client = connect_http(&url, Some("s3cret")).await;
    let calls = (0..10).map(|i| {
        let client = &client;
        async move {
            let code = format!("import time\ntime.sleep(0.1)\nprint({i} * {i})");
            execute_code(client, json!({ "code": code })).await.unwrap()
        }
    });
    let results = futures_util::future::join_all(calls).await;
    for (i, result) in results.iter().enumerate() {
        assert_eq!(result.is_error, Some(false));
        assert_eq!(text(result), format!("{}\n[exit code 0]", i * i));
    }
    let _ = client.cancel().await;
    server.stop().await;
}

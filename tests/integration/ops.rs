//! Operations: /metrics, /openapi.json, request ids and JSON logs,
//! --check-config, the systemd unit, and SIGTERM under load (the container
//! image and the Kubernetes manifests: `container.rs`, `manifests.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::{self, TestServer};

const BIN: &str = env!("CARGO_BIN_EXE_code-executor");

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Samples of a Prometheus text exposition: `name{labels}` -> value.
pub(crate) fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (key, value) = l.rsplit_once(' ').expect("sample line");
            (key.to_string(), value.parse().expect("numeric sample"))
        })
        .collect()
}

pub(crate) async fn scrape(server: &TestServer, token: Option<&str>) -> (u16, String) {
    let mut req = server.client.get(format!("{}/metrics", server.url));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test]
async fn metrics_count_a_known_mix_of_runs() {
    // One worker, so that killing "the worker" below kills the busy one only.
    let server = TestServer::with_config(code_executor::Config {
        pool_size: 1,
        ..crate::common::config()
    })
    .await;
    let env = server.executor.default_env().to_string();
    server.run("print('ok')").await;
    let failed = server.run("raise ValueError('no')").await;
    assert_eq!(failed["error"]["type"], "ValueError");
    let (status, body) = server
        .execute(json!({"code": "import time; time.sleep(30)", "timeout": 0.5}))
        .await;
    assert_eq!((status, &body["timed_out"]), (200, &json!(true)), "{body}");
    // A worker killed mid-run is a crash: 500, one restart. (A run cannot kill
    // its own worker, pid 1 of its pid namespace: kill them from here.)
    let base = server.executor.base_dir().to_path_buf();
    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for pid in crate::common::processes_mentioning(&base) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    });
    let (status, body) = server
        .execute(json!({"code": "import time; time.sleep(5)"}))
        .await;
    killer.await.unwrap();
    assert_eq!(status, 500, "{body}");
    let (status, _) = server.get("/no-such-route").await;
    assert_eq!(status, 404);
    server.wait_for_pool_size(1, Duration::from_secs(20)).await;

    let (status, text) = scrape(&server, None).await;
    assert_eq!(status, 200);
    let m = parse_metrics(&text);
    let get = |key: &str| {
        *m.get(key)
            .unwrap_or_else(|| panic!("no sample {key} in\n{text}"))
    };
    let runs = |outcome: &str| {
        get(&format!(
            r#"code_executor_runs_total{{env="{env}",outcome="{outcome}"}}"#
        ))
    };
    assert_eq!(runs("ok"), 1.0);
    assert_eq!(runs("error"), 1.0);
    assert_eq!(runs("timeout"), 1.0);
    assert_eq!(runs("failed"), 1.0);
    assert_eq!(runs("limit"), 0.0);
    assert_eq!(runs("busy"), 0.0);
    let env_label = format!(r#"{{env="{env}"}}"#);
    assert_eq!(
        get(&format!(
            "code_executor_run_duration_seconds_count{env_label}"
        )),
        4.0
    );
    // The timed-out run alone held its worker for at least its timeout.
    assert!(
        get(&format!(
            "code_executor_run_duration_seconds_sum{env_label}"
        )) >= 0.5
    );
    assert_eq!(
        get(&format!(
            "code_executor_queue_wait_seconds_count{env_label}"
        )),
        4.0
    );
    assert_eq!(
        get(&format!(
            r#"code_executor_run_duration_seconds_bucket{{env="{env}",le="+Inf"}}"#
        )),
        4.0
    );
    assert_eq!(
        get(r#"code_executor_http_requests_total{method="POST",route="/execute",status="200"}"#),
        3.0
    );
    assert_eq!(
        get(r#"code_executor_http_requests_total{method="POST",route="/execute",status="500"}"#),
        1.0
    );
    assert_eq!(
        get(r#"code_executor_http_requests_total{method="GET",route="unmatched",status="404"}"#),
        1.0
    );
    let restarts = |cause: &str| {
        get(&format!(
            r#"code_executor_worker_restarts_total{{env="{env}",cause="{cause}"}}"#
        ))
    };
    assert_eq!(restarts("crash"), 1.0);
    assert_eq!(restarts("timeout"), 0.0);
    let workers = |state: &str| {
        get(&format!(
            r#"code_executor_workers{{env="{env}",state="{state}"}}"#
        ))
    };
    assert_eq!(workers("idle") + workers("busy") + workers("starting"), 1.0);
    assert_eq!(workers("busy"), 0.0);
    // Counted HTTP requests include this scrape while it is served.
    assert_eq!(get("code_executor_http_requests_in_flight"), 1.0);
    assert!(text.contains("# TYPE code_executor_run_duration_seconds histogram"));

    // MCP tool calls over streamable HTTP, by tool and outcome.
    let client = common::mcp::connect_http(&format!("{}/mcp", server.url), None).await;
    common::mcp::execute_code(&client, json!({"code": "print(1)"}))
        .await
        .unwrap();
    common::mcp::execute_code(&client, json!({"code": "import sys; sys.exit(3)"}))
        .await
        .unwrap();
    client.cancel().await.unwrap();
    let m = parse_metrics(&scrape(&server, None).await.1);
    assert_eq!(
        m[r#"code_executor_mcp_tool_calls_total{tool="execute_code",outcome="ok"}"#],
        1.0
    );
    assert_eq!(
        m[r#"code_executor_mcp_tool_calls_total{tool="execute_code",outcome="error"}"#],
        1.0
    );
    assert_eq!(
        m[&format!(r#"code_executor_runs_total{{env="{env}",outcome="error"}}"#)],
        2.0
    );
    server.stop().await;
}

#[tokio::test]
async fn metrics_take_the_metrics_token_or_else_the_api_token() {
    let server = TestServer::with_config(code_executor::Config {
        pool_size: 1,
        token: Some("api".into()),
        metrics_token: Some("scrape".into()),
        ..common::config()
    })
    .await;
    assert_eq!(scrape(&server, None).await.0, 401);
    assert_eq!(scrape(&server, Some("api")).await.0, 401);
    assert_eq!(scrape(&server, Some("scrape")).await.0, 200);
    // The metrics token opens nothing else.
    let resp = server
        .client
        .post(format!("{}/execute", server.url))
        .bearer_auth("scrape")
        .json(&json!({"code": "1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    server.stop().await;

    let server = TestServer::with_config(code_executor::Config {
        pool_size: 1,
        token: Some("api".into()),
        ..common::config()
    })
    .await;
    assert_eq!(scrape(&server, None).await.0, 401);
    assert_eq!(scrape(&server, Some("api")).await.0, 200);
    server.stop().await;
}

/// Check `value` against an OpenAPI 3.1 schema: every required property is
/// present, every present property is documented, every value has the
/// documented type. Returns the problems found, with their JSON paths.
fn check_schema(doc: &Value, schema: &Value, value: &Value, at: &str, problems: &mut Vec<String>) {
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let name = reference.rsplit('/').next().unwrap();
        let target = &doc["components"]["schemas"][name];
        assert!(!target.is_null(), "dangling {reference}");
        return check_schema(doc, target, value, at, problems);
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            let fits = options.iter().any(|option| {
                let mut inner = Vec::new();
                check_schema(doc, option, value, at, &mut inner);
                inner.is_empty()
            });
            if !fits {
                problems.push(format!("{at}: {value} fits none of {key} {schema}"));
            }
            return;
        }
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for part in all {
            check_schema(doc, part, value, at, problems);
        }
        return;
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !types.is_empty() {
        let actual = match value {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        let ok = types.contains(&actual) || (actual == "integer" && types.contains(&"number"));
        if !ok {
            problems.push(format!(
                "{at}: {actual} {value} where the document says {types:?}"
            ));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        problems.push(format!("{at}: {value} is not one of {allowed:?}"));
    }
    match value {
        Value::Object(fields) => {
            let props = schema.get("properties").and_then(Value::as_object);
            for required in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                if !fields.contains_key(required) {
                    problems.push(format!("{at}: required field {required} missing"));
                }
            }
            for (name, field) in fields {
                let path = format!("{at}.{name}");
                match (
                    props.and_then(|p| p.get(name)),
                    schema.get("additionalProperties"),
                ) {
                    (Some(s), _) => check_schema(doc, s, field, &path, problems),
                    (None, Some(extra)) if extra.is_object() => {
                        check_schema(doc, extra, field, &path, problems)
                    }
                    (None, _) => problems.push(format!("{path}: undocumented field")),
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_schema(doc, item_schema, item, &format!("{at}[{i}]"), problems);
                }
            }
        }
        _ => {}
    }
}

/// The documented JSON schema of `method path` answering `status`.
fn response_schema<'a>(doc: &'a Value, method: &str, path: &str, status: u16) -> &'a Value {
    let schema = &doc["paths"][path][method]["responses"][status.to_string()]["content"]["application/json"]
        ["schema"];
    assert!(
        !schema.is_null(),
        "{method} {path} {status} is not documented"
    );
    schema
}

#[tokio::test]
async fn openapi_document_matches_real_responses() {
    let server = TestServer::with_config(code_executor::Config {
        pool_size: 1,
        ..common::config()
    })
    .await;
    let (status, doc) = server.get("/openapi.json").await;
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/execute",
        "/list-envs",
        "/list-packages",
        "/install",
        "/health",
        "/metrics",
    ] {
        assert!(
            doc["paths"][path].is_object(),
            "{path} missing from the document"
        );
    }
    // Requests the document describes are accepted by the server.
    let request_schema =
        &doc["paths"]["/execute"]["post"]["requestBody"]["content"]["application/json"]["schema"];
    let request = json!({
        "code": "open('out.txt', 'w').write('hi')\nprint(input())\n1/0",
        "stdin": "typed\n",
        "files": {"a.txt": "text", "b.bin": {"base64": "AAE="}},
        "timeout": 5,
        "artifacts": ["*.txt"],
        "limits": {"memory_bytes": 1073741824}
    });
    let mut problems = Vec::new();
    check_schema(&doc, request_schema, &request, "request", &mut problems);

    let mut cases: Vec<(&str, &str, u16, Value)> = Vec::new();
    let (status, body) = server.execute(request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["artifacts"][0]["path"], "out.txt", "{body}");
    assert_eq!(body["error"]["type"], "ZeroDivisionError");
    cases.push(("post", "/execute", status, body));
    let (status, body) = server.post("/execute", json!({"code": "2 + 2"})).await;
    assert_eq!(body["result"], "4");
    cases.push(("post", "/execute", status, body));
    let (status, body) = server
        .post("/execute", json!({"env": "nope", "code": "1"}))
        .await;
    assert_eq!(status, 404);
    cases.push(("post", "/execute", status, body));
    let (status, body) = server.post("/execute", json!({"cod": "1"})).await;
    assert_eq!(status, 400);
    cases.push(("post", "/execute", status, body));
    let (status, body) = server.post("/install", json!({"packages": ["x"]})).await;
    assert_eq!(status, 403);
    cases.push(("post", "/install", status, body));
    for path in ["/list-envs", "/list-packages", "/health"] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, 200, "{path}: {body}");
        cases.push(("get", path, status, body));
    }
    for (method, path, status, body) in &cases {
        let schema = response_schema(&doc, method, path, *status);
        check_schema(
            &doc,
            schema,
            body,
            &format!("{method} {path} {status}"),
            &mut problems,
        );
    }
    assert!(
        problems.is_empty(),
        "document and answers disagree:\n{}",
        problems.join("\n")
    );
    // The checker does catch a mismatch.
    let mut caught = Vec::new();
    let schema = response_schema(&doc, "post", "/execute", 200);
    let mut bad = cases[0].3.clone();
    bad["exit_code"] = json!("zero");
    bad["surprise"] = json!(1);
    bad.as_object_mut().unwrap().remove("stdout");
    check_schema(&doc, schema, &bad, "bad", &mut caught);
    assert_eq!(caught.len(), 3, "{caught:?}");
    server.stop().await;
}

/// Start the real binary with `args`; its address once it logged readiness,
/// and its stderr lines so far and to come.
pub(crate) async fn spawn_server(
    args: &[&str],
    tmp: &Path,
) -> (
    tokio::process::Child,
    String,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    spawn_server_bin(Path::new(BIN), args, tmp).await
}

/// [`spawn_server`] through a shell script that ends in
/// `{launch} code-executor "$@"`: `launch` sets up what the server inherits
/// (`exec 7<FILE` then `exec`, `export K=V` then `exec`, `exec prlimit ...`).
pub(crate) async fn spawn_server_wrapped(
    launch: &str,
    args: &[&str],
    tmp: &Path,
) -> (
    tokio::process::Child,
    String,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let wrapper = tmp.join("server.sh");
    std::fs::write(&wrapper, format!("#!/bin/sh\n{launch} {BIN} \"$@\"\n")).unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    spawn_server_bin(&wrapper, args, tmp).await
}

/// [`spawn_server`] through `program` (a wrapper that execs the binary).
async fn spawn_server_bin(
    program: &Path,
    args: &[&str],
    tmp: &Path,
) -> (
    tokio::process::Child,
    String,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let mut child = tokio::process::Command::new(program)
        .args(["serve", "--port", "0", "--python"])
        .arg(common::python())
        .args(args)
        .env("TMPDIR", tmp)
        .env("CODE_EXECUTOR_TOKEN", "")
        // No balancer to wait for (a test that wants one passes --drain-delay).
        .env("CODE_EXECUTOR_DRAIN_DELAY", "0")
        .env_remove("CODE_EXECUTOR_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let address = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let _ = tx.send(line.clone());
            let found = if line.starts_with('{') {
                serde_json::from_str::<Value>(&line)
                    .ok()
                    .and_then(|v| v["address"].as_str().map(str::to_string))
            } else {
                line.split("address=")
                    .nth(1)
                    .map(|rest| rest.split_whitespace().next().unwrap().to_string())
            };
            if let Some(address) = found {
                return address;
            }
        }
        panic!("server exited before it was ready");
    })
    .await
    .expect("server ready within 30 s");
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = tx.send(line);
        }
    });
    (child, address, rx)
}

#[tokio::test]
async fn json_logs_parse_and_carry_the_request_id() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, address, mut logs) =
        spawn_server(&["--pool-size", "1", "--log-format", "json"], tmp.path()).await;
    let client = reqwest::Client::new();
    let marker = "user-secret-7f3a";
    let resp = client
        .post(format!("http://{address}/execute"))
        .header("x-request-id", "client-req-42")
        .json(&json!({"code": format!("print('{marker}')")}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"], "client-req-42");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["stdout"], format!("{marker}\n"));
    // An id that could forge log lines is replaced by a fresh one.
    let resp = client
        .get(format!("http://{address}/health"))
        .header("x-request-id", "bad id")
        .send()
        .await
        .unwrap();
    let fresh = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(fresh.len(), 32, "{fresh}");
    assert!(fresh.chars().all(|c| c.is_ascii_hexdigit()), "{fresh}");

    kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("server exits")
        .unwrap();
    assert!(exit.success());
    let mut lines = Vec::new();
    while let Some(line) = tokio::time::timeout(Duration::from_secs(5), logs.recv())
        .await
        .expect("log stream ends")
    {
        lines.push(line);
    }
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let run = parsed
        .iter()
        .find(|v| v["message"] == "run finished")
        .unwrap_or_else(|| panic!("no run line in {lines:#?}"));
    assert_eq!(run["level"], "INFO");
    assert_eq!(run["outcome"], "ok");
    assert!(run["env"].is_string() && run["worker_pid"].as_u64().unwrap() > 0);
    assert!(run["duration_ms"].as_f64().unwrap() > 0.0);
    let span = run["spans"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "request"))
        .unwrap_or_else(|| panic!("run line without its request span: {run}"));
    assert_eq!(span["request_id"], "client-req-42");
    assert_eq!(span["route"], "/execute");
    // User code and its output are never logged at info.
    assert!(
        !lines.iter().any(|l| l.contains(marker)),
        "user code in logs: {lines:#?}"
    );
}

#[tokio::test]
async fn check_config_accepts_the_example_and_rejects_a_broken_file() {
    let out = std::process::Command::new(BIN)
        .args(["serve", "--check-config", "--config"])
        .arg(repo("examples/config.toml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("configuration is valid"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("system ") && l.contains("python")),
        "the resolved envs are printed: {stdout}"
    );

    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.toml");
    std::fs::write(
        &broken,
        "port = 8080\ntimeout = 30\n\n[[envs]]\nname = \"x\"\npool = 2\n",
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["serve", "--check-config", "--config"])
        .arg(&broken)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("broken.toml: line 6, column 1: unknown field `pool`"),
        "{stderr}"
    );
    std::fs::write(&broken, "port = \"eighty\"\n").unwrap();
    let out = std::process::Command::new(BIN)
        .args(["serve", "--check-config", "--config"])
        .arg(&broken)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("line 1, column 8"), "{stderr}");
}

#[test]
fn the_config_reference_lists_every_option() {
    // The option table is in README.md; the rest of the reference in docs/configuration.md.
    let doc = std::fs::read_to_string(repo("README.md")).unwrap()
        + &std::fs::read_to_string(repo("docs/configuration.md")).unwrap();
    // Every TOML key, as the loader itself names them.
    let err = code_executor::config::parse_file("no_such_key = 1").unwrap_err();
    let keys: Vec<&str> = err
        .split("expected one of ")
        .nth(1)
        .expect("the loader lists its keys")
        .split(", ")
        .map(|k| k.trim_matches('`'))
        .collect();
    assert!(keys.len() > 30, "{keys:?}");
    let env_err = code_executor::config::parse_file("[[envs]]\nno_such_key = 1").unwrap_err();
    let env_keys = env_err
        .split("expected one of ")
        .nth(1)
        .unwrap()
        .split(", ");
    for key in keys
        .iter()
        .copied()
        .chain(env_keys.map(|k| k.trim_matches('`')))
    {
        assert!(
            doc.contains(&format!("| `{key}` |")),
            "`{key}` missing from README.md and docs/configuration.md"
        );
    }
    // Every flag and variable of `serve`.
    let help = std::process::Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let mut flags = 0;
    for word in
        help.split(|c: char| c.is_whitespace() || c == '[' || c == ']' || c == ',' || c == '=')
    {
        let word = word.trim_end_matches(':');
        if (word.starts_with("--") && word.len() > 2 && word != "--help")
            || word.starts_with("CODE_EXECUTOR_")
        {
            flags += 1;
            assert!(
                doc.contains(&format!("`{word}`")),
                "{word} missing from README.md and docs/configuration.md"
            );
        }
    }
    assert!(flags > 20, "{help}");
    // The example parses with the real loader.
    let text = std::fs::read_to_string(repo("examples/config.toml")).unwrap();
    let file = code_executor::config::parse_file(&text).unwrap();
    let config =
        code_executor::Config::merge(&code_executor::config::Options::default(), file).unwrap();
    assert_eq!(config.envs.len(), 1);
    assert!(config.envs[0].default);
}

#[test]
fn the_systemd_unit_passes_systemd_analyze() {
    let analyze = Path::new("/usr/bin/systemd-analyze");
    assert!(
        analyze.exists(),
        "systemd-analyze is needed for this test (apt-get install systemd)"
    );
    let unit = std::fs::read_to_string(repo("deploy/code-executor.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/code-executor serve"));
    for hardening in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "KillSignal=SIGTERM",
    ] {
        assert!(unit.contains(hardening), "{hardening} missing");
    }
    // verify checks that ExecStart exists: point it at the built binary.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("code-executor.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/code-executor", BIN)).unwrap();
    let out = std::process::Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // It exits 0 on unknown keys, only warning: any remark on the unit fails.
    let remarks: Vec<_> = stderr
        .lines()
        .filter(|l| l.contains("code-executor.service"))
        .collect();
    assert!(out.status.success() && remarks.is_empty(), "{stderr}");
    // And it does flag a typo.
    std::fs::write(
        &path,
        unit.replace(BIN, "/bin/true")
            .replace("ProtectSystem", "ProtectSytem"),
    )
    .unwrap();
    let out = std::process::Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("ProtectSytem"));
}

#[tokio::test]
async fn sigterm_answers_twenty_in_flight_runs_refuses_new_ones_and_exits_clean() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, address, mut logs) = spawn_server(&["--pool-size", "4"], tmp.path()).await;
    tokio::spawn(async move { while logs.recv().await.is_some() {} });
    let url = format!("http://{address}");
    let runs: Vec<_> = (0..20)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                // One client per run: each its own connection.
                let resp = reqwest::Client::new()
                    .post(format!("{url}/execute"))
                    .json(&json!({"code": format!("import time; time.sleep(0.4); print({i})")}))
                    .send()
                    .await
                    .expect("answered");
                (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
            })
        })
        .collect();
    // Wait until all 20 are being served (the scrape counts itself).
    let scraper = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = scraper
            .get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if parse_metrics(&text)["code_executor_http_requests_in_flight"] >= 21.0 {
            break;
        }
        assert!(Instant::now() < deadline, "20 requests never in flight");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(scraper);
    kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // New connections are refused while the 20 finish.
    let refused = reqwest::Client::new()
        .get(format!("{url}/health"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(
        refused.is_err(),
        "accepted a request after SIGTERM: {refused:?}"
    );

    for (i, run) in runs.into_iter().enumerate() {
        let (status, body) = run.await.unwrap();
        assert_eq!(status, 200, "run {i}: {body}");
        assert_eq!(body["stdout"], format!("{i}\n"));
    }
    let exit = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("server exits after SIGTERM")
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{exit:?}");
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left = common::processes_mentioning(tmp.path());
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "processes left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
